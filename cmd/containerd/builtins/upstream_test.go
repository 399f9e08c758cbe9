package builtins

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// mirrored are the upstream files whose behaviour Pullwise repeats or
// replaces, pinned by content. containerd internals cannot be imported, so
// the code that copies their steps can only drift silently: when the
// containerd module moves, this fails with the files to re-read
// (docs/development.md, "Moving to a new containerd release").
var mirrored = []struct {
	path, sha256, by string
}{
	{"internal/cri/server/images/image_pull.go", "f9ae4af022b16b23b7752138492b7d2b64ed27dfd747c7e79245a9f7f59e8567",
		"cri/cripull: PullImage's steps, credentials, the runtime handler's snapshotter, the records written after a pull"},
	{"internal/cri/config/config.go", "9aa71866da6c444be83389ca9df712a51467c89a5777588e1bfa2812d496f2cb",
		"cri/criconfig: the image config's JSON fields, CheckLocalImagePullConfigs"},
	{"internal/cri/labels/labels.go", "46ea0e5121f557f552e6216fbccf431f9ac7e500fd8fa0dd6f689a73ac2892a4",
		"cri/cripull: CRI's image labels"},
	{"internal/cri/annotations/annotations.go", "e12ec7d4506570c4bedd785d7e24b15f168953dccda38df43a9e351632a1b6a7",
		"cri/cripull: the runtime-handler annotation"},
	{"plugins/cri/images/plugin.go", "7d11fb77332536bb971990015e7792d1b3383f7a1b559db681f192bffef3f194",
		"plugin/pullwise: the images plugin's exports and its effective config"},
	{"plugins/transfer/plugin.go", "babb120a3dc76d0fc47661a9078d0e00b5f438eae31bc4d122633138c8389986",
		"plugin/transfer: the transfer plugin's config keys, defaults, unpack platforms"},
	{"plugins/server/grpc/plugin.go", "8481f75a1167e6a558c5a5ca293afca7fe2db193b3745fe8c1202569197d0036",
		"plugin/server: the grpc and grpc-tcp server plugins"},
	{"plugins/server/grpc/metrics.go", "b2f7d287899d7e37ed2911b65dcc243511ee3c54e4b64f15d3506b374fd9eb32",
		"plugin/server: the grpc-prometheus and grpc-otel plugins"},
}

func TestMirroredUpstreamUnchanged(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/containerd/containerd/v2").Output()
	if err != nil {
		t.Fatalf("go list the containerd module: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	var changed []string
	for _, m := range mirrored {
		b, err := os.ReadFile(filepath.Join(dir, m.path))
		if err != nil {
			changed = append(changed, m.path+" (gone: "+err.Error()+") -> "+m.by)
			continue
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != m.sha256 {
			changed = append(changed, m.path+" (sha256 "+got+") -> "+m.by)
		}
	}
	if len(changed) > 0 {
		t.Fatalf("upstream files Pullwise mirrors changed in %s; re-read each, carry the change into the package named, then pin its new sha256 here:\n  %s",
			dir, strings.Join(changed, "\n  "))
	}
}
