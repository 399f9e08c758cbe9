package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

// client holds the clients of one runtime endpoint.
type client struct {
	endpoint string
	conn     *grpc.ClientConn
	runtime  criapi.RuntimeServiceClient
	images   criapi.ImageServiceClient
	pullwise api.PullwiseClient
	timeout  time.Duration
}

func dial(cmd *cli.Command) (*client, error) {
	endpoint := cmd.String("runtime-endpoint")
	target := endpoint
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		// grpc's own unix resolver takes the unix:// form as it is.
	case strings.HasPrefix(endpoint, "/"):
		target = "unix://" + endpoint
	default:
		return nil, fmt.Errorf("runtime endpoint %q: only unix sockets are supported (unix:///path)", endpoint)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("runtime endpoint %s: %w", endpoint, err)
	}
	return &client{
		endpoint: endpoint,
		conn:     conn,
		runtime:  criapi.NewRuntimeServiceClient(conn),
		images:   criapi.NewImageServiceClient(conn),
		pullwise: api.NewPullwiseClient(conn),
	}, nil
}

func (c *client) Close() error { return c.conn.Close() }

// withClient gives a command's action a connected client and a context
// bounded by --timeout, for commands made of short calls.
func withClient(action func(context.Context, *cli.Command, *client) error) cli.ActionFunc {
	return withLongClient(func(ctx context.Context, cmd *cli.Command, c *client) error {
		ctx, cancel := c.short(ctx)
		defer cancel()
		return action(ctx, cmd, c)
	})
}

// withLongClient is withClient for commands that last as long as a pull:
// their context ends only with Ctrl-C, and each short call they make is
// bounded by c.short. A clock would fail any large image on a real link,
// and the runtime already gives up on a pull that stops making progress
// (CRI's image_pull_progress_timeout).
func withLongClient(action func(context.Context, *cli.Command, *client) error) cli.ActionFunc {
	return func(ctx context.Context, cmd *cli.Command) error {
		c, err := dial(cmd)
		if err != nil {
			return err
		}
		defer c.Close()
		c.timeout = cmd.Duration("timeout")
		return action(ctx, cmd, c)
	}
}

// short bounds one call by --timeout, as crictl does.
func (c *client) short(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// explain turns a gRPC error into a message a user can act on; an
// unreachable runtime names the endpoint.
func (c *client) explain(what string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	switch st.Code() {
	case codes.Unavailable:
		// The runtime answers Unavailable itself when no registry could
		// serve a pull: only a runtime that does not answer at all is out
		// of reach.
		if c.reachable() {
			return fmt.Errorf("%s: %s", what, strings.TrimPrefix(st.Message(), what+": "))
		}
		return fmt.Errorf("cannot reach the runtime at %s: %s", c.endpoint, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: no answer from %s within the timeout", what, c.endpoint)
	case codes.Canceled:
		return fmt.Errorf("%s: cancelled", what)
	case codes.Unimplemented:
		return fmt.Errorf("%s: the runtime at %s does not serve this (%s); is it a Pullwise containerd?", what, c.endpoint, st.Message())
	case codes.NotFound:
		return fmt.Errorf("%s: not found: %s", what, st.Message())
	}
	// The Pullwise API already says what failed, e.g. "pull REF: ...".
	return errors.New(what + ": " + strings.TrimPrefix(st.Message(), what+": "))
}

// reachable reports whether the runtime answers a Version call now.
func (c *client) reachable() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.pullwise.Version(ctx, &api.VersionRequest{})
	return err == nil
}
