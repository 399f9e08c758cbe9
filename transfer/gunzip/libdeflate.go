//go:build cgo && !no_libdeflate

package gunzip

// libdeflate (Debian's libdeflate-dev) is linked statically, so the
// daemon needs nothing more at run time than stock containerd does.

/*
#cgo LDFLAGS: -l:libdeflate.a
#include <libdeflate.h>
*/
import "C"

import "unsafe"

// wholeLayers says layers can be inflated whole (whole.go).
const wholeLayers = true

// inflate inflates src, a gzip member, into dst and returns how many bytes
// it wrote. ok is false unless src is exactly one valid member (CRC-32 and
// size checked) whose data fits dst: the caller then streams the layer,
// which reads further members or says what is wrong.
//
// libdeflate is used because it inflates in one call what it holds whole,
// several times as fast as klauspost/compress streams it
// (BenchmarkLayerFromFile measures both); no Go package comes near it,
// and there is no Go binding of it on the module proxy, so this is one.
func inflate(dst, src []byte) (n int, ok bool) {
	if len(src) == 0 || cap(dst) == 0 {
		return 0, false
	}
	// A decompressor is a few KiB of tables; allocating one per layer
	// costs nothing next to the layer, and nothing is left for the
	// garbage collector to miss.
	d := C.libdeflate_alloc_decompressor()
	if d == nil {
		return 0, false
	}
	defer C.libdeflate_free_decompressor(d)
	var in, out C.size_t
	r := C.libdeflate_gzip_decompress_ex(d,
		unsafe.Pointer(unsafe.SliceData(src)), C.size_t(len(src)),
		unsafe.Pointer(unsafe.SliceData(dst)), C.size_t(len(dst)),
		&in, &out)
	return int(out), r == C.LIBDEFLATE_SUCCESS && int(in) == len(src)
}
