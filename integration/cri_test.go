package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/registry"
)

// TestCRIImageLifecycleThroughMirror drives kubelet's CRI client through a
// pull, list, status and removal, with the mirror configured in hosts.toml,
// and checks at both registries where the bytes came from.
func TestCRIImageLifecycleThroughMirror(t *testing.T) {
	for _, mode := range []string{mirrorSeeded, mirrorProxy} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, envOptions{mirror: mode})
			ctx := context.Background()
			img := e.push("team/app", "v1", registry.Image{Layers: []int64{256 << 10, 64 << 10}, Seed: 1})

			v, err := e.runtime.Version(ctx, "v1")
			if err != nil {
				t.Fatal(err)
			}
			if v.GetRuntimeName() != "containerd" {
				t.Fatalf("runtime name %q, want containerd", v.GetRuntimeName())
			}

			ref, err := e.images.PullImage(ctx, &criapi.ImageSpec{Image: img.Ref}, nil, nil)
			if err != nil {
				t.Fatalf("PullImage %s: %v", img.Ref, err)
			}
			if ref != img.Config.String() {
				t.Fatalf("PullImage returned %q, want the image ID %s", ref, img.Config)
			}

			// Every blob came from the mirror, once.
			for _, l := range img.Layers {
				n := e.mirror.Count(func(r registry.Request) bool {
					return r.Kind == registry.KindBlob && r.Reference == l.String() && r.Method == "GET" && r.Status == 200
				})
				if n != 1 {
					t.Errorf("mirror served layer %s %d times, want 1", l, n)
				}
			}
			direct := e.upstream.Count(func(r registry.Request) bool {
				return isContainerd(r)
			})
			if direct != 0 {
				t.Errorf("containerd sent %d requests straight to upstream, want 0 with a working mirror", direct)
			}
			if mode == mirrorProxy {
				// The pull-through cache fetched the layers from upstream.
				for _, l := range img.Layers {
					if e.upstream.Count(func(r registry.Request) bool { return r.Reference == l.String() && r.Status == 200 }) == 0 {
						t.Errorf("proxy mirror never fetched layer %s from upstream", l)
					}
				}
			}

			list, err := e.images.ListImages(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !hasImage(list, img.Ref) {
				t.Fatalf("ListImages lacks %s: %v", img.Ref, list)
			}

			st, err := e.images.ImageStatus(ctx, &criapi.ImageSpec{Image: img.Ref}, false)
			if err != nil {
				t.Fatal(err)
			}
			if st.GetImage().GetId() != img.Config.String() {
				t.Fatalf("ImageStatus id %q, want %s", st.GetImage().GetId(), img.Config)
			}
			wantDigest := fmt.Sprintf("%s/team/app@%s", e.upstream.Host(), img.Digest)
			if !contains(st.GetImage().GetRepoDigests(), wantDigest) {
				t.Fatalf("repo digests %v lack %s", st.GetImage().GetRepoDigests(), wantDigest)
			}

			if err := e.images.RemoveImage(ctx, &criapi.ImageSpec{Image: img.Ref}); err != nil {
				t.Fatal(err)
			}
			st, err = e.images.ImageStatus(ctx, &criapi.ImageSpec{Image: img.Ref}, false)
			if err != nil {
				t.Fatal(err)
			}
			if st.GetImage() != nil {
				t.Fatalf("image still present after RemoveImage: %v", st.GetImage())
			}
		})
	}
}

// TestEveryCRIRPCPassesInterceptorChain checks, through the chain's own
// request counter, that Pullwise interceptors see unary and streaming CRI
// RPCs alike.
func TestEveryCRIRPCPassesInterceptorChain(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := context.Background()
	count := func(method string) float64 {
		return e.metric(fmt.Sprintf(`pullwise_cri_requests_total{code="OK",method="%s"}`, method))
	}

	unary := []struct {
		method string
		call   func() error
	}{
		{"/runtime.v1.RuntimeService/Version", func() error { _, err := e.runtime.Version(ctx, "v1"); return err }},
		{"/runtime.v1.RuntimeService/Status", func() error { _, err := e.runtime.Status(ctx, false); return err }},
		{"/runtime.v1.ImageService/ImageFsInfo", func() error { _, err := e.images.ImageFsInfo(ctx); return err }},
		{"/runtime.v1.ImageService/ImageStatus", func() error {
			_, err := e.images.ImageStatus(ctx, &criapi.ImageSpec{Image: "example.com/none:1"}, false)
			return err
		}},
	}
	for _, u := range unary {
		before := count(u.method)
		if err := u.call(); err != nil {
			t.Fatalf("%s: %v", u.method, err)
		}
		if got := count(u.method); got != before+1 {
			t.Errorf("%s: chain counted %v -> %v, want one more", u.method, before, got)
		}
	}

	// cri-client lists through the streaming RPCs when asked to.
	streaming := []struct {
		method string
		call   func() error
	}{
		{"/runtime.v1.ImageService/StreamImages", func() error { _, err := e.images.ListImages(ctx, nil); return err }},
		{"/runtime.v1.RuntimeService/StreamPodSandboxes", func() error { _, err := e.runtime.ListPodSandbox(ctx, nil); return err }},
		{"/runtime.v1.RuntimeService/StreamContainers", func() error { _, err := e.runtime.ListContainers(ctx, nil); return err }},
	}
	for _, s := range streaming {
		before := count(s.method)
		if err := s.call(); err != nil {
			t.Fatalf("%s: %v", s.method, err)
		}
		eventually(t, 5*time.Second, s.method+" counted", func() bool { return count(s.method) == before+1 })
	}

	// GetContainerEvents is a long-lived stream: it shows as open while it
	// runs. (It only notices its client leaving when it next sends, so its
	// end cannot be awaited here.)
	evCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	established := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.runtime.GetContainerEvents(evCtx, make(chan *criapi.ContainerEventResponse, 1),
			func(criapi.RuntimeService_GetContainerEventsClient) { close(established) })
	}()
	<-established
	const events = `pullwise_cri_streams_open{method="/runtime.v1.RuntimeService/GetContainerEvents"}`
	eventually(t, 5*time.Second, "GetContainerEvents open in the chain", func() bool { return e.metric(events) == 1 })
	cancel()
	<-done
}

func isContainerd(r registry.Request) bool {
	ua := r.Header.Get("User-Agent")
	return len(ua) >= 10 && ua[:10] == "containerd"
}

func hasImage(list []*criapi.Image, ref string) bool {
	for _, img := range list {
		if contains(img.GetRepoTags(), ref) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func criImage(ref string) *criapi.ImageSpec { return &criapi.ImageSpec{Image: ref} }
