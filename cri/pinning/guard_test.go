package pinning

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestCheckRemoval(t *testing.T) {
	s := newTestStore(t)
	for _, r := range []record{
		// Labelled by an earlier pass.
		{name: pause310, target: pauseManifest, labels: pinnedByConfig},
		// Not labelled yet: config pins it all the same.
		{name: pauseID, target: pauseManifest},
		{name: app, target: appManifest, labels: pinnedByHand},
		// An earlier config's pin, about to be removed.
		{name: pause311, target: newPauseManifest, labels: pinnedByConfig},
		{name: reg + "/other:1", target: otherManifest},
		{ns: "default", name: reg + "/other:1", target: otherManifest, labels: pinnedByHand},
	} {
		s.create(t, r)
	}
	pins, err := NewPins(map[string]string{"sandbox": pause310, "base": "registry.example.com/pause:3.10"})
	if err != nil {
		t.Fatal(err)
	}
	g := NewGuard(s, pins)

	for _, tc := range []struct {
		name      string
		names     []string
		wantImage string   // "" means allowed
		wantKeys  []string // nil for a hand pin
		wantMsg   []string
	}{
		{
			name:      "named by config",
			names:     []string{pause310},
			wantImage: pause310,
			wantKeys:  []string{"base", "sandbox"},
			wantMsg: []string{
				`image "` + pause310 + `" is pinned`,
				`pinned_images.base and pinned_images.sandbox in [plugins."io.containerd.cri.v1.images"] name it`,
				"change pinned_images.base and pinned_images.sandbox and restart containerd",
				`set protect_pinned_images = false in [plugins."io.containerd.grpc.v1.pullwise"]`,
			},
		},
		{
			name:      "pinned through its target before it is labelled",
			names:     []string{pauseID},
			wantImage: pauseID,
			wantKeys:  []string{"base", "sandbox"},
		},
		{
			name:      "first pinned name of several",
			names:     []string{"missing:1", reg + "/other:1", app, pause310},
			wantImage: app,
		},
		{
			name:      "hand pin",
			names:     []string{app},
			wantImage: app,
			wantMsg: []string{
				`image "` + app + `" is pinned`,
				"label io.cri-containerd.pinned=pinned, which was not set from pinned_images",
				"ctr -n k8s.io images label " + app + " io.cri-containerd.pinned=",
				`set protect_pinned_images = false in [plugins."io.containerd.grpc.v1.pullwise"]`,
			},
		},
		{name: "pin of an older config", names: []string{pause311}},
		{name: "not pinned", names: []string{reg + "/other:1"}},
		{name: "not present", names: []string{"registry.example.com/missing:1"}},
		{name: "no names", names: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := g.CheckRemoval(context.Background(), tc.names...)
			if tc.wantImage == "" {
				if err != nil {
					t.Fatalf("removal refused: %v", err)
				}
				return
			}
			var pe *PinnedError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is no *PinnedError", err)
			}
			if !errdefs.IsFailedPrecondition(err) {
				t.Errorf("error is not a failed precondition")
			}
			if pe.Image != tc.wantImage || (tc.wantKeys != nil && !slices.Equal(pe.Keys, tc.wantKeys)) {
				t.Errorf("refused %q by %v, want %q by %v", pe.Image, pe.Keys, tc.wantImage, tc.wantKeys)
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("message lacks %q:\n%s", m, err)
				}
			}
		})
	}
}

func TestPinnedErrorOneKey(t *testing.T) {
	msg := (&PinnedError{Image: "x", Keys: []string{"sandbox"}}).Error()
	if !strings.Contains(msg, "pinned_images.sandbox in [plugins.\"io.containerd.cri.v1.images\"] names it") {
		t.Fatalf("message: %s", msg)
	}
}
