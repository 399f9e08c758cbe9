package service

import (
	"context"
	"strings"
	"testing"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

func TestVersionReportsBypass(t *testing.T) {
	for _, usesTransfer := range []bool{true, false} {
		s := New(Runtime{
			PullwiseVersion: "v1", Name: "containerd", Version: "v2.4.2",
			PullPath: func() (bool, string) {
				if usesTransfer {
					return true, ""
				}
				return false, BypassWarning([]string{"discard_unpacked_layers"})
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
