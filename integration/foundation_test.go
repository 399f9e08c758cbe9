package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

const (
	pulledSample = `pullwise_pulls_total{outcome="pulled"}`
	failedSample = `pullwise_pulls_total{outcome="failed"}`
)

// TestCtrPullGoesThroughTransferWrapper shows that ctr's pulls, which reach
// containerd through the transfer gRPC service, go through Pullwise's
// transfer plugin: its pull counter moves, for a success and a failure.
func TestCtrPullGoesThroughTransferWrapper(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("tools/ctr", "v1", registry.Image{Layers: []int64{128 << 10}, Seed: 2})

	if out, err := e.ctr("default", "image", "pull", "--plain-http", img.Ref); err != nil {
		t.Fatalf("ctr image pull: %v\n%s", err, out)
	}
	if got := e.metric(pulledSample); got != 1 {
		t.Fatalf("%s = %v after one ctr pull, want 1", pulledSample, got)
	}
	if n := e.upstream.Count(func(r registry.Request) bool {
		return r.Kind == registry.KindBlob && r.Reference == img.Layers[0].String() && r.Status == 200
	}); n != 1 {
		t.Fatalf("upstream served the layer %d times, want 1", n)
	}
	out, err := e.ctr("default", "image", "ls", "-q")
	if err != nil || !strings.Contains(out, img.Ref) {
		t.Fatalf("ctr image ls lacks %s (err %v):\n%s", img.Ref, err, out)
	}

	missing := e.upstream.Host() + "/tools/ctr:missing"
	if out, err := e.ctr("default", "image", "pull", "--plain-http", missing); err == nil {
		t.Fatalf("ctr pulled a tag that does not exist:\n%s", out)
	}
	if got := e.metric(failedSample); got != 1 {
		t.Fatalf("%s = %v after one failed pull, want 1", failedSample, got)
	}
}

func TestCtrVersion(t *testing.T) {
	e := newEnv(t, envOptions{})
	out, err := e.ctr("default", "version")
	if err != nil {
		t.Fatalf("ctr version: %v\n%s", err, out)
	}
	server := out[strings.Index(out, "Server:"):]
	if !strings.Contains(server, "Version:") || !strings.Contains(server, "UUID:") {
		t.Fatalf("ctr version shows no server version:\n%s", out)
	}
}

// TestTransferBypassIsReported covers the Version RPC and the start-up
// log: CRI pulls reach Pullwise under the options that send CRI down its
// local path too, so nothing warns of a bypass. (The warning, for a node
// that disables the cri-pull interceptor, is covered in cri/service.)
func TestTransferBypassIsReported(t *testing.T) {
	for _, tc := range []struct {
		name         string
		criImages    string
		usesTransfer bool
	}{
		{name: "default", usesTransfer: true},
		// The options that send CRI down its local path: Pullwise serves
		// those pulls instead.
		{name: "use_local_image_pull", criImages: criLocalPull.toml, usesTransfer: true},
		{name: "discard_unpacked_layers", criImages: criDiscard.toml, usesTransfer: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{criImages: tc.criImages})
			resp, err := e.pullwise.Version(context.Background(), &api.VersionRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetCriPullsUseTransfer() != tc.usesTransfer {
				t.Fatalf("cri_pulls_use_transfer = %v, want %v", resp.GetCriPullsUseTransfer(), tc.usesTransfer)
			}
			logged := strings.Contains(e.d.Log(), "CRI pulls bypass the transfer service")
			if logged || (len(resp.GetWarnings()) > 0) == tc.usesTransfer {
				t.Fatalf("usesTransfer=%v but logged=%v, warnings=%q", tc.usesTransfer, logged, resp.GetWarnings())
			}

			out, err := e.pullctl("version", "-o", "json")
			if err != nil {
				t.Fatalf("pullctl version: %v\n%s", err, out)
			}
			var v struct {
				RuntimeName         string   `json:"runtimeName"`
				PullwiseVersion     string   `json:"pullwiseVersion"`
				CRIPullsUseTransfer bool     `json:"criPullsUseTransfer"`
				Warnings            []string `json:"warnings"`
			}
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatalf("pullctl version -o json: %v\n%s", err, out)
			}
			if v.RuntimeName != "containerd" || v.PullwiseVersion == "" || v.CRIPullsUseTransfer != tc.usesTransfer {
				t.Fatalf("pullctl version says %+v", v)
			}
		})
	}
}

func TestPullctl(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("tools/pullctl", "v2", registry.Image{Layers: []int64{64 << 10}, Seed: 3})
	if _, err := e.images.PullImage(context.Background(), criImage(img.Ref), nil, nil); err != nil {
		t.Fatal(err)
	}

	out, err := e.pullctl("version")
	if err != nil || !strings.Contains(out, "RuntimeName:") || !strings.Contains(out, "containerd") || !strings.Contains(out, "PullwiseVersion:") {
		t.Fatalf("pullctl version (err %v):\n%s", err, out)
	}

	out, err = e.pullctl("images")
	if err != nil {
		t.Fatalf("pullctl images: %v\n%s", err, out)
	}
	repo := e.upstream.Host() + "/tools/pullctl"
	if !strings.Contains(out, "IMAGE ID") || !strings.Contains(out, repo) || !strings.Contains(out, "v2") {
		t.Fatalf("pullctl images lacks %s:v2:\n%s", repo, out)
	}

	out, err = e.pullctl("images", "-o", "json")
	if err != nil {
		t.Fatalf("pullctl images -o json: %v\n%s", err, out)
	}
	var list struct {
		Images []struct {
			ID       string   `json:"id"`
			RepoTags []string `json:"repoTags"`
		} `json:"images"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	if len(list.Images) != 1 || list.Images[0].ID != img.Config.String() || !contains(list.Images[0].RepoTags, img.Ref) {
		t.Fatalf("pullctl images -o json: %+v", list)
	}
}

func TestPullctlDeadEndpoint(t *testing.T) {
	dead := "unix://" + t.TempDir() + "/nothing.sock"
	for _, cmd := range [][]string{{"version"}, {"images"}} {
		out, err := run(t, "pullctl", append([]string{"-r", dead}, cmd...)...)
		if err == nil {
			t.Fatalf("pullctl %v against a dead endpoint exited 0:\n%s", cmd, out)
		}
		if !strings.Contains(out, dead) {
			t.Fatalf("pullctl %v error does not name the endpoint %s:\n%s", cmd, dead, out)
		}
	}
}

// TestConfigDefaultShowsPullwise: operators discover the section and its
// defaults from `containerd config default`.
func TestConfigDefaultShowsPullwise(t *testing.T) {
	out, err := run(t, "containerd", "config", "default")
	if err != nil {
		t.Fatalf("containerd config default: %v\n%s", err, out)
	}
	i := strings.Index(out, "[plugins.'io.containerd.grpc.v1.pullwise']")
	if i < 0 {
		t.Fatalf("no pullwise section in:\n%s", out)
	}
	section := out[i:]
	section = section[:strings.Index(section, "\n\n")]
	for _, want := range []string{
		"max_parallel_image_pulls = 0",
		"pull_queue_timeout = '0s'",
		"progress_address = '127.0.0.1'",
		"progress_port = 0",
		"progress_token_ttl = '1m0s'",
		"always_pull_policy = 'Always'",
		"protect_pinned_images = true",
		"registry_response_timeout = '15s'",
		"registry_read_timeout = '30s'",
		"registry_cooldown = '10s'",
		"registry_max_cooldown = '5m0s'",
		"registry_max_retry_wait = '30s'",
	} {
		if !strings.Contains(section, want) {
			t.Errorf("pullwise section lacks %q:\n%s", want, section)
		}
	}
	if !strings.Contains(out, "version = 4") {
		t.Errorf("default config is not version 4")
	}
}

// TestBadRequestDoesNotKillDaemon: a request that makes upstream code
// panic (an images Update without a target) gets Internal, and containerd
// keeps serving.
func TestBadRequestDoesNotKillDaemon(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("bad/app", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 1100})
	e.criPull(img.Ref)
	_, err := imagesapi.NewImagesClient(e.conn).Update(inNamespace("k8s.io"), &imagesapi.UpdateImageRequest{
		Image:      &imagesapi.Image{Name: img.Ref, Labels: map[string]string{"a": "b"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels.a"}},
	})
	if code(err) != "Internal" {
		t.Fatalf("malformed update: %v, want Internal", err)
	}
	if _, err := e.runtime.Version(context.Background(), "v1"); err != nil {
		t.Fatalf("containerd stopped serving: %v", err)
	}
}
