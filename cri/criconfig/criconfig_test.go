package criconfig

import (
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
