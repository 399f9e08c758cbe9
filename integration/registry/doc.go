// Package registry runs real CNCF Distribution registries on loopback for
// integration tests, records the requests they receive, injects faults, and
// seeds deterministic images.
//
// Starting registries:
//
//	up := registry.Start(t, registry.Options{Name: "upstream"})
//	mirror := registry.Start(t, registry.Options{Name: "mirror", ProxyRemoteURL: up.URL()})
//	up.Host() // "127.0.0.1:PORT"
//	up.URL()  // "http://127.0.0.1:PORT"
//
// Each registry stores blobs on the filesystem under t.TempDir() and stops
// in t.Cleanup. ProxyRemoteURL turns it into a pull-through cache.
//
// Seeding:
//
//	p := up.Push(t, "library/app", "v1", registry.Image{Layers: []int64{1 << 20, 4 << 10}, Seed: 7})
//	p.Ref, p.Digest, p.Config, p.Layers, p.LayerSizes
//	img, err := registry.BuildImage(registry.Image{...}) // go-containerregistry v1.Image, not pushed
//
// An Image is an OCI image for linux/runtime.GOARCH whose layers are gzip
// tars holding one file of pseudo-random bytes each. The same Image always
// has the same digests.
//
// Recording:
//
//	r.Requests() []Request                  // finished requests, by start time
//	r.Count(func(Request) bool) int
//	r.Reset()                               // forget requests, restart peaks
//	r.WaitIdle(ctx) error                   // wait for in-flight handlers
//	r.PeakConcurrency() int                 // max requests in flight at once
//	r.PeakRepos() int                       // max repositories in flight at once
//	r.PeakByRepo() map[string]int           // per repository, max in flight
//
// A Request carries Method, Path, Header, Kind (KindManifest, KindBlob,
// KindUpload, KindTags, KindBase, KindOther), Repo, Reference, Status, Bytes
// (body bytes sent), Start, End and Faulted.
//
// Faults:
//
//	r.SetFault(func(req registry.Request) *registry.Fault { ... }) // nil removes
//	registry.When(match, fault)  // fault for matching requests
//	registry.Times(n, fn)        // only the first n faults of fn
//
// A Fault can return a Status (with RetryAfter), Delay the response, pace
// the body at BytesPerSecond, abort the connection after TruncateAfter body
// bytes, or RequireBasicAuth.
//
// Distribution logs through logrus' process-wide standard logger and its
// handlers ignore the configured log level, so the first Start silences that
// logger for the whole process. Set REGISTRY_LOG_LEVEL=debug (any logrus
// level) to see the registries' logs instead.
//
// Every distribution app starts a notification broadcaster goroutine
// (github.com/docker/go-events.(*Broadcaster).run) that App.Shutdown does
// not stop; leak checkers must ignore it. Start disables the app's other
// background goroutines (upload purger, proxy TTL scheduler).
package registry
