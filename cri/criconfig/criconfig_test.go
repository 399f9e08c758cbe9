package criconfig

import (
	"slices"
	"testing"
)

func TestRead(t *testing.T) {
	type imageConfig struct {
		Snapshotter       string            `json:"snapshotter"`
		UseLocalImagePull bool              `json:"useLocalImagePull"`
		PinnedImages      map[string]string `json:"pinned_images"`
	}
	for _, tc := range []struct {
		name         string
		config       any
		usesTransfer bool
		wantErr      bool
		sandbox      string
	}{
		{name: "transfer", config: &imageConfig{PinnedImages: map[string]string{"sandbox": "pause:3.10"}}, usesTransfer: true, sandbox: "pause:3.10"},
		{name: "local pull", config: &imageConfig{UseLocalImagePull: true}},
		{name: "unknown shape", config: map[string]string{"x": "y"}, wantErr: true},
		{name: "not encodable", config: func() {}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Read(tc.config)
			var uses bool
			if err == nil {
				uses, err = c.UsesTransfer()
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if uses != tc.usesTransfer || c.PinnedImages["sandbox"] != tc.sandbox {
				t.Fatalf("got uses=%v pins=%v", uses, c.PinnedImages)
			}
		})
	}
}

func TestLocalPullOptions(t *testing.T) {
	// CRI's Linux defaults, as its config reads after init.
	base := func() map[string]any {
		return map[string]any{"useLocalImagePull": false, "disableSnapshotAnnotations": true, "maxConcurrentDownloads": 3}
	}
	for _, tc := range []struct {
		name string
		set  map[string]any
		want []string
	}{
		{name: "transfer path", want: nil},
		{name: "use_local_image_pull alone", set: map[string]any{"useLocalImagePull": true}, want: []string{"use_local_image_pull"}},
		{name: "discard (EKS)", set: map[string]any{"useLocalImagePull": true, "discardUnpackedLayers": true}, want: []string{"discard_unpacked_layers"}},
		{name: "several", set: map[string]any{
			"useLocalImagePull": true, "disableSnapshotAnnotations": false, "imagePullWithSyncFs": true, "maxConcurrentDownloads": 5,
			"registry": map[string]any{"mirrors": map[string]any{"docker.io": map[string]any{"endpoint": []string{"https://m"}}}},
		}, want: []string{"disable_snapshot_annotations = false", "registry.mirrors", "max_concurrent_downloads", "image_pull_with_sync_fs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			for k, v := range tc.set {
				cfg[k] = v
			}
			c, err := Read(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.LocalPullOptions(); !slices.Equal(got, tc.want) {
				t.Fatalf("LocalPullOptions() = %q, want %q", got, tc.want)
			}
		})
	}
}
