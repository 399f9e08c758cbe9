package main
import (
 _ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
 _ "github.com/containerd/containerd/v2/cmd/containerd/command"
 _ "k8s.io/cri-client/pkg"
 _ "k8s.io/cri-api/pkg/apis/runtime/v1"
 _ "github.com/distribution/distribution/v3/registry/handlers"
 _ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
 _ "github.com/distribution/distribution/v3/registry/proxy"
 _ "github.com/google/go-containerregistry/pkg/v1/remote"
 _ "github.com/urfave/cli/v3"
)
func main(){}
