// Package version holds the Pullwise version, set at build time.
package version

// Version is overridden by the Makefile with -ldflags -X.
var Version = "dev"
