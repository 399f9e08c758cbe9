package service

import (
	"context"
	"strings"
	"testing"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

func TestCRIUsesTransfer(t *testing.T) {
	type imageConfig struct {
		Snapshotter       string `json:"snapshotter"`
		UseLocalImagePull bool   `json:"useLocalImagePull"`
	}
	for _, tc := range []struct {
		name    string
		config  any
		want    bool
		wantErr bool
	}{
		{name: "transfer", config: &imageConfig{Snapshotter: "overlayfs"}, want: true},
		{name: "local pull", config: &imageConfig{UseLocalImagePull: true}, want: false},
		{name: "unknown shape", config: map[string]string{"x": "y"}, wantErr: true},
		{name: "not encodable", config: func() {}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CRIUsesTransfer(tc.config)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCRIPinnedImages(t *testing.T) {
	type imageConfig struct {
		PinnedImages map[string]string `json:"pinned_images"`
	}
	got, err := CRIPinnedImages(&imageConfig{PinnedImages: map[string]string{"sandbox": "registry.k8s.io/pause:3.10", "other": "b:1", "empty": ""}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "b:1,registry.k8s.io/pause:3.10" {
		t.Fatalf("got %q", got)
	}
	if got, err := CRIPinnedImages(&imageConfig{}); err != nil || len(got) != 0 {
		t.Fatalf("no pins: %q %v", got, err)
	}
}

func TestVersionReportsBypass(t *testing.T) {
	for _, usesTransfer := range []bool{true, false} {
		s := New(Runtime{
			PullwiseVersion: "v1", Name: "containerd", Version: "v2.4.2",
			PullPath: func() (bool, string) {
				if usesTransfer {
					return true, ""
				}
				return false, BypassWarning
			},
		})
		resp, err := s.Version(context.Background(), &api.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetCriPullsUseTransfer() != usesTransfer || resp.GetPullwiseVersion() != "v1" || resp.GetRuntimeName() != "containerd" {
			t.Fatalf("unexpected response %v", resp)
		}
		if hasWarning := len(resp.GetWarnings()) == 1 && strings.Contains(resp.GetWarnings()[0], "bypass"); hasWarning == usesTransfer {
			t.Fatalf("usesTransfer=%v but warnings %q", usesTransfer, resp.GetWarnings())
		}
	}
}
