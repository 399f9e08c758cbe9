package policy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	remoteserrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

var (
	localDigest  = digest.FromString("local")
	remoteDigest = digest.FromString("remote")
	status503    = remoteserrors.ErrUnexpectedStatus{StatusCode: 503, Status: "503 Service Unavailable"}
	status429    = remoteserrors.ErrUnexpectedStatus{StatusCode: 429, Status: "429 Too Many Requests"}
	status401    = remoteserrors.ErrUnexpectedStatus{StatusCode: 401, Status: "401 Unauthorized"}
	refused      = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	// What the resolver returns when every host failed (source.AllFailedError).
	allUnavailable = fmt.Errorf("all registries failed: %w", errdefs.ErrUnavailable)
	allThrottled   = fmt.Errorf("all registries failed: %w", errdefs.ErrResourceExhausted)
	allDenied      = fmt.Errorf("all registries failed: %w", errdefs.ErrPermissionDenied)
)

type fake struct {
	present   bool
	remote    []error // errors of successive resolves; nil entries succeed
	digest    digest.Digest
	resolves  int
	pulls     int
	reasserts int
}

func (f *fake) deps() Deps {
	return Deps{
		Local: func(context.Context, string) (Local, bool, error) {
			return Local{ImageID: "sha256:local-id", Target: localDigest}, f.present, nil
		},
		Resolve: func(context.Context, string, *runtime.AuthConfig) (digest.Digest, string, time.Duration, error) {
			f.resolves++
			if i := f.resolves - 1; i < len(f.remote) && f.remote[i] != nil {
				return "", "", 0, f.remote[i]
			}
			return f.digest, "mirror:5000/app:v1", 0, nil
		},
		Pull: func(context.Context, *runtime.PullImageRequest) (string, error) {
			f.pulls++
			return "sha256:new-id", nil
		},
		Reassert: func(context.Context, string, string, string) { f.reasserts++ },
	}
}

func TestDecisions(t *testing.T) {
	fast := Retry{Attempts: 3, Backoff: time.Millisecond, MaxWait: 5 * time.Millisecond}
	for _, tc := range []struct {
		name      string
		policy    Policy
		fake      fake
		reason    string
		pulled    bool
		resolves  int
		warning   bool
		wantErr   error
		reasserts int
	}{
		{name: "ifnewer, absent", policy: IfNewerNotPresent, reason: ReasonNotPresent, pulled: true},
		{name: "ifnewer, same digest", policy: IfNewerNotPresent, fake: fake{present: true, digest: localDigest},
			reason: ReasonUpToDate, resolves: 1, reasserts: 1},
		{name: "ifnewer, moved", policy: IfNewerNotPresent, fake: fake{present: true, digest: remoteDigest},
			reason: ReasonRemoteChanged, pulled: true, resolves: 1},
		{name: "ifnewer, refused then up", policy: IfNewerNotPresent, fake: fake{present: true, digest: localDigest, remote: []error{refused}},
			reason: ReasonUpToDate, resolves: 2, reasserts: 1},
		{name: "ifnewer, registry down", policy: IfNewerNotPresent, fake: fake{present: true, remote: []error{refused, refused, refused}},
			reason: ReasonRegistryUnavailable, resolves: 3, warning: true},
		{name: "ifnewer, 503 and 429", policy: IfNewerNotPresent, fake: fake{present: true, remote: []error{status503, status429, status503, status503}},
			reason: ReasonRegistryUnavailable, resolves: 3, warning: true},
		{name: "ifnewer, every host unavailable", policy: IfNewerNotPresent, fake: fake{present: true, remote: []error{allUnavailable, allThrottled, allUnavailable}},
			reason: ReasonRegistryUnavailable, resolves: 3, warning: true},
		{name: "ifnewer, every host denied", policy: IfNewerNotPresent, fake: fake{present: true, remote: []error{allDenied}},
			resolves: 1, wantErr: errdefs.ErrPermissionDenied},
		{name: "ifnewer, 401 is an error", policy: IfNewerNotPresent, fake: fake{present: true, remote: []error{status401}},
			resolves: 1, wantErr: status401},
		{name: "ifnewer, 404 is an error", policy: IfNewerNotPresent, fake: fake{present: true, remote: []error{errdefs.ErrNotFound}},
			resolves: 1, wantErr: errdefs.ErrNotFound},
		{name: "never, present", policy: Never, fake: fake{present: true}, reason: ReasonPolicyNever},
		{name: "never, absent", policy: Never, wantErr: errdefs.ErrFailedPrecondition},
		{name: "ifnotpresent, present", policy: IfNotPresent, fake: fake{present: true}, reason: ReasonPresent},
		{name: "ifnotpresent, absent", policy: IfNotPresent, reason: ReasonNotPresent, pulled: true},
		{name: "always, present", policy: Always, fake: fake{present: true}, reason: ReasonPolicyAlways, pulled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake
			d := New(f.deps(), fast)
			dec, err := d.Pull(context.Background(), &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: "example.com/app:v1"}}, tc.policy)
			if tc.wantErr != nil {
				if !matches(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				if f.pulls != 0 {
					t.Fatal("pulled despite the error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if dec.Reason != tc.reason || dec.Pulled != tc.pulled || f.resolves != tc.resolves || f.reasserts != tc.reasserts {
				t.Fatalf("decision %+v after %d resolves, %d reasserts", dec, f.resolves, f.reasserts)
			}
			if (len(dec.Warnings) > 0) != tc.warning {
				t.Fatalf("warnings %q", dec.Warnings)
			}
			if tc.pulled != (f.pulls == 1) {
				t.Fatalf("%d pulls", f.pulls)
			}
			if dec.ImageRef == "" {
				t.Fatal("no image ref")
			}
		})
	}
}

func TestRetryHonoursRetryAfterAndDeadline(t *testing.T) {
	var waits []time.Time
	f := &fake{present: true}
	deps := f.deps()
	deps.Resolve = func(context.Context, string, *runtime.AuthConfig) (digest.Digest, string, time.Duration, error) {
		waits = append(waits, time.Now())
		return "", "", 40 * time.Millisecond, status429
	}
	d := New(deps, Retry{Attempts: 2, Backoff: time.Millisecond, MaxWait: time.Second})
	dec, err := d.Pull(context.Background(), &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: "example.com/app:v1"}}, IfNewerNotPresent)
	if err != nil || dec.Reason != ReasonRegistryUnavailable {
		t.Fatalf("%+v %v", dec, err)
	}
	if len(waits) != 2 || waits[1].Sub(waits[0]) < 40*time.Millisecond {
		t.Fatalf("second try came %v after the first, before Retry-After", waits[1].Sub(waits[0]))
	}

	// A deadline too close for the next wait stops retrying at once.
	waits = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	d = New(deps, Retry{Attempts: 5, Backoff: time.Second, MaxWait: time.Second})
	dec, err = d.Pull(ctx, &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: "example.com/app:v1"}}, IfNewerNotPresent)
	if err != nil || dec.Reason != ReasonRegistryUnavailable || len(waits) != 1 {
		t.Fatalf("%+v %v after %d tries", dec, err, len(waits))
	}
	if !strings.Contains(dec.Warnings[0], "deadline") {
		t.Fatalf("warning %q does not say the deadline cut the retries", dec.Warnings[0])
	}
}

func TestDigestReferenceNeedsNoCheck(t *testing.T) {
	f := &fake{present: true}
	d := New(f.deps(), DefaultRetry)
	dec, err := d.Pull(context.Background(), &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: "example.com/app@" + localDigest.String()}}, IfNewerNotPresent)
	if err != nil || dec.Reason != ReasonUpToDate || f.resolves != 0 || f.pulls != 0 {
		t.Fatalf("%+v %v after %d resolves", dec, err, f.resolves)
	}
}

func TestInvalidReference(t *testing.T) {
	d := New((&fake{}).deps(), DefaultRetry)
	_, err := d.Pull(context.Background(), &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: "Not A Ref"}}, Always)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("err %v", err)
	}
}

// matches is errors.Is, but registry status errors (not comparable) match
// by status code.
func matches(err, want error) bool {
	var w remoteserrors.ErrUnexpectedStatus
	if errors.As(want, &w) {
		var got remoteserrors.ErrUnexpectedStatus
		return errors.As(err, &got) && got.StatusCode == w.StatusCode
	}
	return errors.Is(err, want)
}
