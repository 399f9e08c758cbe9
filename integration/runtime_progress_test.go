package integration

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// kepMessages builds KEP-5334's two messages from their text in the KEP,
// as a client generated from the KEP's api.proto would have them, without
// any Pullwise type.
func kepMessages(t *testing.T) (req, resp protoreflect.MessageDescriptor) {
	t.Helper()
	str := func(name string, n int32) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{
			Name: proto.String(name), Number: proto.Int32(n), JsonName: proto.String(name),
			Type:  descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
		}
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("kep5334/api.proto"), Package: proto.String("runtime.v1"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("ImagePullProgressRequest"), Field: []*descriptorpb.FieldDescriptorProto{str("pod_sandbox_id", 1), str("container_id", 2)}},
			{Name: proto.String("ImagePullProgressResponse"), Field: []*descriptorpb.FieldDescriptorProto{str("url", 1)}},
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().Get(0), fd.Messages().Get(1)
}

// TestProgressOnRuntimeService: a client built from KEP-5334's API calls
// /runtime.v1.RuntimeService/ImagePullProgress on containerd's socket and
// gets a working stream URL for a pod's pulls, with the KEP's error codes,
// while the rest of runtime.v1 still reaches the upstream CRI plugin.
func TestProgressOnRuntimeService(t *testing.T) {
	e, _ := newPodEnv(t, envOptions{})
	app := e.pushRunnable("kep/app", "v1", 9300)
	podID, podCfg := e.runPod(t, "kep")
	ctx := context.Background()

	reqDesc, respDesc := kepMessages(t)
	call := func(pod, ctr string) (string, error) {
		req := dynamicpb.NewMessage(reqDesc)
		if pod != "" {
			req.Set(reqDesc.Fields().ByName("pod_sandbox_id"), protoreflect.ValueOfString(pod))
		}
		if ctr != "" {
			req.Set(reqDesc.Fields().ByName("container_id"), protoreflect.ValueOfString(ctr))
		}
		resp := dynamicpb.NewMessage(respDesc)
		err := e.conn.Invoke(ctx, "/runtime.v1.RuntimeService/ImagePullProgress", req, resp)
		return resp.Get(respDesc.Fields().ByName("url")).String(), err
	}

	url, err := call(podID, "")
	if err != nil || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("KEP ImagePullProgress(pod) = %q, %v", url, err)
	}
	lines := readStream(t, ctx, url)
	throttleBlobs(e.upstream, 2<<20)
	if _, err := e.images.PullImage(ctx, criImage(app.Ref), nil, podCfg); err != nil {
		t.Fatal(err)
	}
	var last progressLine
	n := 0
	for l := range lines {
		last, n = l, n+1
	}
	if n == 0 || last.Image != app.Ref || last.Layer != "" || last.Total == 0 || last.Progress != last.Total {
		t.Fatalf("the pod's stream (%d lines) ended on %+v, want %s complete", n, last, app.Ref)
	}

	ctr := e.createContainer(t, podID, podCfg, "app", app.Ref)
	if url, err := call("", ctr); err != nil || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("KEP ImagePullProgress(container) = %q, %v", url, err)
	}

	for _, tc := range []struct {
		name     string
		pod, ctr string
		code     codes.Code
		msg      string
	}{
		{"neither id", "", "", codes.InvalidArgument, "one of pod_sandbox_id or container_id is required"},
		{"unknown pod", "0123456789abcdef", "", codes.NotFound, `pod sandbox "0123456789abcdef" not found`},
		{"unknown container", "", "0123456789abcdef", codes.NotFound, `container "0123456789abcdef" not found`},
		{"container of another pod", "0123456789abcdef", ctr, codes.InvalidArgument, "is not in pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := call(tc.pod, tc.ctr)
			if st := status.Convert(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}

	// The rest of runtime.v1 is upstream CRI's, untouched.
	v, err := e.runtime.Version(ctx, "")
	if err != nil || v.GetRuntimeName() != "containerd" {
		t.Fatalf("runtime.v1 Version: %v, %v", v, err)
	}
	if st, err := e.runtime.PodSandboxStatus(ctx, podID, false); err != nil || st.GetStatus().GetId() != podID {
		t.Fatalf("runtime.v1 PodSandboxStatus: %v", err)
	}
	err = e.conn.Invoke(ctx, "/runtime.v1.RuntimeService/NoSuchMethod", dynamicpb.NewMessage(reqDesc), dynamicpb.NewMessage(respDesc))
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("an unknown runtime.v1 method: %v, want Unimplemented", err)
	}
}
