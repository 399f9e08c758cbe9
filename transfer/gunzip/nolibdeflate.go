//go:build !cgo || no_libdeflate

package gunzip

// Built without cgo or with the tag no_libdeflate, every gzip layer is
// streamed through pgzip.
const wholeLayers = false

func inflate(_, _ []byte) (int, bool) { return 0, false }
