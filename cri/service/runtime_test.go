package service

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

// TestRuntimeImagePullProgressBadInput: the KEP's method answers a request
// it cannot use with InvalidArgument.
func TestRuntimeImagePullProgressBadInput(t *testing.T) {
	s := New(Runtime{})
	gs := grpc.NewServer(grpc.UnknownServiceHandler(func(srv any, stream grpc.ServerStream) error {
		return s.ExtraMethods()[RuntimeImagePullProgress](srv, stream)
	}))
	l := bufconn.Listen(1 << 20)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return l.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	for _, tc := range []struct {
		name string
		req  any
	}{
		{"no id", &api.RuntimeImagePullProgressRequest{}},
		// Answered before any lookup, without echoing it whole.
		{"1 MiB pod id", &api.RuntimeImagePullProgressRequest{PodSandboxId: strings.Repeat("a", 1<<20)}},
		// Field 1 sent as a varint where the KEP has a string.
		{"wrong wire type", wrapperspb.Int64(7)},
		// (Bytes that do not decode at all, such as a string that is not
		// UTF-8, get Internal from grpc-go before any handler runs: gRPC's
		// status table gives that code to "error parsing request proto".)
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := conn.Invoke(context.Background(), RuntimeImagePullProgress, tc.req, &api.ImagePullProgressResponse{})
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() == "" || len(st.Message()) > 1024 {
				t.Fatalf("got %v, want InvalidArgument with a message", err)
			}
		})
	}
}
