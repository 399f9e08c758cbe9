package server

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// echo is a plugin instance that owns no service but adds a method to the
// health service, as cri/service adds ImagePullProgress to CRI's.
type echo struct{}

func (echo) ExtraMethods() map[string]grpc.StreamHandler {
	return map[string]grpc.StreamHandler{"/grpc.health.v1.Health/Echo": func(_ any, stream grpc.ServerStream) error {
		var in wrapperspb.StringValue
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		return stream.SendMsg(wrapperspb.String("echo " + in.GetValue()))
	}}
}

type owned struct{}

func (owned) ExtraMethods() map[string]grpc.StreamHandler {
	return map[string]grpc.StreamHandler{"/grpc.health.v1.Health/Check": nil}
}

func TestExtraMethods(t *testing.T) {
	extra := &methods{handlers: map[string]grpc.StreamHandler{}}
	s := grpc.NewServer(grpc.UnknownServiceHandler(extra.handle))
	extra.server = s
	healthpb.RegisterHealthServer(s, health.NewServer())
	if err := extra.add(echo{}); err != nil {
		t.Fatal(err)
	}
	if err := extra.add(echo{}); err == nil {
		t.Fatal("a method added twice was accepted")
	}
	if err := extra.add(owned{}); err == nil {
		t.Fatal("a method its own service serves was accepted")
	}

	l := bufconn.Listen(1 << 20)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return l.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := context.Background()

	var out wrapperspb.StringValue
	if err := conn.Invoke(ctx, "/grpc.health.v1.Health/Echo", wrapperspb.String("hi"), &out); err != nil || out.GetValue() != "echo hi" {
		t.Fatalf("extra method: %q, %v", out.GetValue(), err)
	}
	// The owning service's own methods are untouched.
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("registered method: %v", err)
	}
	for _, tc := range []struct{ method, msg string }{
		{"/grpc.health.v1.Health/Nope", "unknown method /grpc.health.v1.Health/Nope"},
		{"/no.Such/Method", "unknown service no.Such"},
	} {
		err := conn.Invoke(ctx, tc.method, wrapperspb.String(""), &out)
		if st := status.Convert(err); st.Code() != codes.Unimplemented || st.Message() != tc.msg {
			t.Errorf("%s: %v, want Unimplemented %q", tc.method, err, tc.msg)
		}
	}
}
