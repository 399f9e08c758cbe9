package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

type progressLine struct {
	Image    string `json:"image"`
	Layer    string `json:"layer"`
	Progress int64  `json:"progress"`
	Total    int64  `json:"total"`
	Error    string `json:"error"`
	State    string `json:"state"`
}

// throttleBlobs makes layer downloads slow enough to watch.
func throttleBlobs(r *registry.Registry, bps int64) {
	r.SetFault(func(req registry.Request) *registry.Fault {
		if req.Kind == registry.KindBlob {
			return &registry.Fault{BytesPerSecond: bps}
		}
		return nil
	})
}

func (e *env) progressURL(req *api.ImagePullProgressRequest) string {
	e.t.Helper()
	resp, err := e.pullwise.ImagePullProgress(context.Background(), req)
	if err != nil {
		e.t.Fatalf("ImagePullProgress: %v", err)
	}
	return resp.GetUrl()
}

// readStream reads a progress stream to its end, checking every line's
// keys, and sends each line on the returned channel.
func readStream(t *testing.T, ctx context.Context, url string) <-chan progressLine {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	out := make(chan progressLine, 1024)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var raw map[string]any
			if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
				t.Errorf("line %q: %v", sc.Text(), err)
				return
			}
			if _, ok := raw["progress"]; !ok {
				t.Errorf("line without progress: %s", sc.Text())
			}
			if _, ok := raw["total"]; !ok {
				t.Errorf("line without total: %s", sc.Text())
			}
			for k, v := range raw {
				// state is there only for a layer mounted lazily.
				if k == "state" && v == "lazy" {
					continue
				}
				if k != "image" && k != "layer" && k != "progress" && k != "total" && k != "error" {
					t.Errorf("unexpected key %q: %s", k, sc.Text())
				}
			}
			var l progressLine
			_ = json.Unmarshal(sc.Bytes(), &l)
			out <- l
		}
	}()
	return out
}

func TestProgressStreamOfAPull(t *testing.T) { forEachCRIPullConfig(t, testProgressStreamOfAPull) }

func testProgressStreamOfAPull(t *testing.T, criImages string) {
	e := newEnv(t, envOptions{criImages: criImages})
	img := e.push("progress/app", "v1", registry.Image{Layers: []int64{1 << 20, 1 << 20}, Seed: 1000})
	throttleBlobs(e.upstream, 512<<10)
	ctx := context.Background()

	url := e.progressURL(&api.ImagePullProgressRequest{Image: img.Ref})
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("progress URL %q is not on loopback", url)
	}
	lines := readStream(t, ctx, url)
	pullErr := make(chan error, 1)
	go func() { _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); pullErr <- err }()

	last := map[string]int64{}
	var got []progressLine
	for l := range lines {
		got = append(got, l)
		if l.Layer == "" {
			continue
		}
		if strings.HasPrefix(l.Layer, "layer-") || !strings.HasPrefix(l.Layer, "sha256:") {
			t.Fatalf("layer %q is not a plain digest", l.Layer)
		}
		if l.Progress < last[l.Layer] {
			t.Fatalf("progress of %s went back: %d after %d", l.Layer, l.Progress, last[l.Layer])
		}
		last[l.Layer] = l.Progress
	}
	if err := <-pullErr; err != nil {
		t.Fatal(err)
	}
	end := got[len(got)-1]
	if end.Layer != "" || end.Image != img.Ref || end.Progress != end.Total || end.Total != img.LayerBytes() || end.Error != "" {
		t.Fatalf("stream ended on %+v, want the complete image line of %d bytes", end, img.LayerBytes())
	}
	for _, d := range img.Layers {
		final := lastFor(got, d.String())
		if final == nil || final.Progress != final.Total || final.Total == 0 {
			t.Fatalf("layer %s ended at %+v", d, final)
		}
	}
	intermediate := 0
	for _, l := range got {
		if l.Layer != "" && l.Progress > 0 && l.Progress < l.Total {
			intermediate++
		}
	}
	if intermediate == 0 {
		t.Fatal("no line showed a layer part-way: progress is not streamed")
	}

	// The URL works once.
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("second GET: %s, want 404", resp.Status)
	}
}

func lastFor(lines []progressLine, layer string) *progressLine {
	var out *progressLine
	for i := range lines {
		if lines[i].Layer == layer {
			out = &lines[i]
		}
	}
	return out
}

func TestProgressLateJoinAndFollowFalse(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("progress/late", "v1", registry.Image{Layers: []int64{1 << 20}, Seed: 1010})
	throttleBlobs(e.upstream, 1<<20)
	ctx := context.Background()
	pullErr := make(chan error, 1)
	go func() { _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); pullErr <- err }()
	eventually(t, 10*time.Second, "pull under way", func() bool {
		p := e.listPulls()
		return len(p) == 1 && p[0].GetBytesDone() > 64<<10 // past manifest and config: into the layer
	})
	// follow=false: the state now, then the end of the stream.
	var snapshot []progressLine
	for l := range readStream(t, ctx, e.progressURL(&api.ImagePullProgressRequest{Image: img.Ref})+"?follow=false") {
		snapshot = append(snapshot, l)
	}
	layer := lastFor(snapshot, img.Layers[0].String())
	if layer == nil || layer.Progress == 0 {
		t.Fatalf("late join did not start from the current state: %+v", snapshot)
	}
	if err := <-pullErr; err != nil {
		t.Fatal(err)
	}
}

func TestProgressCancelledPullEndsWithError(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("progress/cancel", "v1", registry.Image{Layers: []int64{2 << 20}, Seed: 1020})
	throttleBlobs(e.upstream, 256<<10)
	ctx := context.Background()
	lines := readStream(t, ctx, e.progressURL(&api.ImagePullProgressRequest{Image: img.Ref}))
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pullErr := make(chan error, 1)
	go func() { _, err := e.images.PullImage(pctx, criImage(img.Ref), nil, nil); pullErr <- err }()
	for l := range lines {
		if l.Layer != "" && l.Progress > 0 {
			cancel()
			break
		}
	}
	var last progressLine
	for l := range lines {
		last = l
	}
	if <-pullErr == nil {
		t.Fatal("cancelled pull succeeded")
	}
	if last.Layer != "" || last.Error == "" {
		t.Fatalf("stream ended on %+v, want an image line with the error", last)
	}
}

func TestProgressSelectorsAndTokens(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: "[plugins.\"io.containerd.grpc.v1.pullwise\"]\n  progress_token_ttl = \"300ms\"\n"})
	ctx := context.Background()
	_, err := e.pullwise.ImagePullProgress(ctx, &api.ImagePullProgressRequest{})
	if code(err) != "InvalidArgument" {
		t.Fatalf("no selector: %v", err)
	}
	_, err = e.pullwise.ImagePullProgress(ctx, &api.ImagePullProgressRequest{PodSandboxId: "nope"})
	if code(err) != "NotFound" || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown pod: %v", err)
	}
	_, err = e.pullwise.ImagePullProgress(ctx, &api.ImagePullProgressRequest{ContainerId: "nope"})
	if code(err) != "NotFound" {
		t.Fatalf("unknown container: %v", err)
	}
	out, err := e.pullctl("progress", "not-a-pod")
	if err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("pullctl progress of an unknown pod (err %v):\n%s", err, out)
	}

	// An unused URL expires (progress_token_ttl is 300ms here); the
	// lifetime itself is what is tested, so wait it out.
	url := e.progressURL(&api.ImagePullProgressRequest{Image: "example.com/app:v1"})
	time.Sleep(400 * time.Millisecond)
	if !tokenAnswers404(url) {
		t.Fatal("an expired URL still streams")
	}
	// A fresh one works, once.
	url = e.progressURL(&api.ImagePullProgressRequest{Image: "example.com/app:v1"})
	if tokenAnswers404(url) {
		t.Fatal("a fresh URL answered 404")
	}
	if !tokenAnswers404(url) {
		t.Fatal("a used URL streams again")
	}
}

// tokenAnswers404 uses url once, without following.
func tokenAnswers404(url string) bool {
	resp, err := http.Get(url + "?follow=false")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 404
}

func TestProgressPullctl(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("progress/ctl", "v1", registry.Image{Layers: []int64{256 << 10}, Seed: 1030})
	out, err := e.pullctl("progress", "--image", img.Ref, "--print-url")
	if err != nil || !strings.HasPrefix(strings.TrimSpace(out), "http://127.0.0.1:") {
		t.Fatalf("pullctl progress --print-url (err %v):\n%s", err, out)
	}
	// Hold the pull, so pullctl joins it for sure, then let it finish:
	// pullctl, not on a terminal, prints the NDJSON and exits 0.
	release := e.upstream.HoldBlobs(t, func(string) bool { return true })
	pullErr := make(chan error, 1)
	go func() {
		_, err := e.images.PullImage(context.Background(), criImage(img.Ref), nil, nil)
		pullErr <- err
	}()
	eventually(t, 10*time.Second, "pull in flight", func() bool { return len(e.listPulls()) == 1 })
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		o, err := e.pullctl("progress", "--image", img.Ref)
		done <- result{o, err}
	}()
	// pullctl's first line is the current state; once the registry sees
	// nothing new it is still waiting: release the pull.
	release()
	if err := <-pullErr; err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("pullctl progress: %v\n%s", res.err, res.out)
	}
	lines := strings.Split(strings.TrimSpace(res.out), "\n")
	var last progressLine
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Layer != "" || last.Progress != last.Total || last.Total == 0 {
		t.Fatalf("pullctl progress output ends with %q", lines[len(lines)-1])
	}
}

func TestProgressSubscribersLeakNothing(t *testing.T) {
	e := newEnv(t, envOptions{noKeepAlive: true})
	img := e.push("progress/many", "v1", registry.Image{Layers: []int64{1 << 20}, Seed: 1040})
	throttleBlobs(e.upstream, 512<<10)
	e.listPulls()
	baseline := e.d.Goroutines(t)
	ctx := context.Background()
	pullErr := make(chan error, 1)
	go func() { _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); pullErr <- err }()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var wg sync.WaitGroup
	for i := range 200 {
		url := e.progressURL(&api.ImagePullProgressRequest{Image: img.Ref})
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(400))*time.Millisecond)
			defer cancel()
			req, err := http.NewRequestWithContext(sctx, http.MethodGet, url, nil)
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 512)
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					return
				}
			}
		}()
		_ = i
	}
	wg.Wait()
	if err := <-pullErr; err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, fmt.Sprintf("goroutines back to baseline %d", baseline), func() bool {
		return e.d.Goroutines(t) <= baseline
	})
}
