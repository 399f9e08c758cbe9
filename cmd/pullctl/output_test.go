package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

// TestPrintJSONNumbers: scripts get counts, sizes and times as JSON
// numbers, not protojson's quoted 64-bit integers, at any depth, while
// strings that look like numbers stay strings.
func TestPrintJSONNumbers(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  proto.Message
		want string
	}{
		{
			name: "pulls",
			msg: &api.ListPullsResponse{Pulls: []*api.Pull{{
				Image: "r/app:1", State: "waiting", WaitedMs: 1500, BytesDone: 2360893, BytesTotal: 1 << 40, Callers: 2,
				Pod:            &criapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "123", Attempt: 1},
				BytesFromPeers: 1 << 20,
			}}},
			want: `{"pulls":[{"image":"r/app:1","state":"waiting","waitedMs":1500,"bytesDone":2360893,"bytesTotal":1099511627776,"callers":2,
				"pod":{"name":"web","namespace":"default","uid":"123","attempt":1},"bytesFromPeers":1048576}]}`,
		},
		{
			name: "no pulls",
			msg:  &api.ListPullsResponse{},
			want: `{"pulls":[]}`,
		},
		{
			name: "map values and a numeric string",
			msg:  &api.RegistryHost{Host: "12345", Since: 1700000000000000000, Requests: map[string]uint64{"ok": 3}},
			want: `{"host":"12345","state":"","since":1700000000000000000,"lastError":"","lastErrorAt":0,"nextProbe":0,"failures":0,"requests":{"ok":3},"kind":"","serves":[],"retryAt":0}`,
		},
		{
			name: "CRI image size",
			msg:  &api.ImageStatusResponse{Image: &criapi.Image{Id: "sha256:1", Size: 4096}},
			want: `{"image":{"id":"sha256:1","repoTags":[],"repoDigests":[],"size":4096,"uid":null,"username":"","spec":null,"pinned":false},"pullSource":"","info":{}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printJSON(&out, tc.msg); err != nil {
				t.Fatal(err)
			}
			var got, want any
			d := json.NewDecoder(&out)
			d.UseNumber()
			if err := d.Decode(&got); err != nil {
				t.Fatal(err)
			}
			d = json.NewDecoder(bytes.NewReader([]byte(tc.want)))
			d.UseNumber()
			if err := d.Decode(&want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				b, _ := json.Marshal(got)
				t.Fatalf("got  %s\nwant %s", b, tc.want)
			}
		})
	}
}
