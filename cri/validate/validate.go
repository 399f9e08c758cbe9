// Package validate refuses CRI image requests that cannot be served, with
// gRPC InvalidArgument and a message saying why. Upstream CRI answers a
// malformed image name or auth with Unknown, and a credentials error deep in
// a pull can only surface as a failed pull; checking at the API edge gives
// the caller the real reason before any work starts.
package validate

import (
	"context"
	"encoding/base64"
	"net/url"
	"strconv"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

const pullImageMethod = "/runtime.v1.ImageService/PullImage"

// maxQuoted bounds how much of a bad value goes into a message: a 1 MiB
// name must not come back whole in the error or the log.
const maxQuoted = 256

// PullImage checks what a pull needs: an image reference (a name, or a
// digest CRI resolves locally) and, when given, auth that CRI can decode.
func PullImage(req *runtime.PullImageRequest) error {
	name := req.GetImage().GetImage()
	if name == "" {
		return status.Error(codes.InvalidArgument, "image is required")
	}
	if len(name) > maxName {
		// Not worth a parse: the reference grammar is a regexp.
		return status.Errorf(codes.InvalidArgument, "image is %d bytes, longer than any valid reference: %s", len(name), quote(name))
	}
	if _, err := digest.Parse(name); err != nil {
		if _, err := reference.ParseDockerRef(name); err != nil {
			return status.Errorf(codes.InvalidArgument, "image %s is not a valid reference: %v", quote(name), err)
		}
	}
	return Auth(req.GetAuth())
}

// Auth checks the fields of auth that CRI decodes (containerd's
// ParseAuth): the server address is a URL, and auth, when it is what
// applies, is base64 of user:password.
func Auth(auth *runtime.AuthConfig) error {
	if auth == nil {
		return nil
	}
	if a := auth.GetServerAddress(); a != "" {
		if _, err := url.Parse(a); err != nil {
			return status.Errorf(codes.InvalidArgument, "auth server_address %s is not a URL: %v", quote(a), err)
		}
	}
	if auth.GetUsername() != "" || auth.GetIdentityToken() != "" || auth.GetAuth() == "" {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(auth.GetAuth())
	if err != nil {
		// The value is a secret: say what is wrong, not what it is.
		return status.Errorf(codes.InvalidArgument, "auth is not base64: %v", err)
	}
	if !strings.Contains(string(b), ":") {
		return status.Error(codes.InvalidArgument, "auth does not decode to user:password")
	}
	return nil
}

func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "…"
	}
	return strconv.Quote(s)
}

// maxName bounds the names and IDs the Pullwise API takes. The longest
// valid image reference is well under 1 KiB, IDs are 64 hex digits; a
// longer value names nothing, and answering NotFound would repeat it whole
// in the message and the log.
const maxName = 4096

// names returns the names and IDs a Pullwise request carries, by field.
func names(req any) map[string]string {
	switch r := req.(type) {
	case *api.PullImageRequest:
		return map[string]string{"image": r.GetImage().GetImage()}
	case *api.ImageStatusRequest:
		return map[string]string{"image": r.GetImage().GetImage()}
	case *api.ContainerStatusRequest:
		return map[string]string{"container_id": r.GetContainerId()}
	case *api.ImagePullProgressRequest:
		return map[string]string{"image": r.GetImage(), "pod_sandbox_id": r.GetPodSandboxId(), "container_id": r.GetContainerId()}
	}
	return nil
}

// Request refuses a request of method that cannot be served: a CRI
// PullImage that PullImage rejects, or a Pullwise request naming something
// longer than any name can be. Handlers that take a request past the unary
// interceptors (the KEP-5334 method on CRI's service is a stream handler)
// call it themselves.
func Request(method string, req any) error {
	if r, ok := req.(*runtime.PullImageRequest); ok && method == pullImageMethod {
		if err := PullImage(r); err != nil {
			return err
		}
	}
	for field, v := range names(req) {
		if len(v) > maxName {
			return status.Errorf(codes.InvalidArgument, "%s is %d bytes, longer than any valid one: %s", field, len(v), quote(v))
		}
	}
	return nil
}

// Interceptor applies Request to every unary call.
type Interceptor struct{}

// UnaryServerInterceptor implements interceptor.Unary.
func (Interceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := Request(info.FullMethod, req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}
