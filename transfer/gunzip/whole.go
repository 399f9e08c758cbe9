package gunzip

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/bits"
	"slices"
	"sync"

	"golang.org/x/sync/semaphore"
	"golang.org/x/sys/unix"
)

// A layer is inflated whole, in one call to libdeflate, when both its blob
// and its tar stream fit these bounds and the budget has room for both;
// any other layer is streamed. Whole, inflating a layer takes a fraction
// of the CPU streaming does, and the tar writer then reads memory. Most
// layers of most images are below the bounds; the budget caps the memory
// of all layers being applied at once, whatever the unpack concurrency,
// and a layer that finds it spent is streamed rather than made to wait.
var (
	maxBlob    = 16 << 20
	maxTar     = 64 << 20
	budgetSize = int64(256 << 20)
	budget     = semaphore.NewWeighted(budgetSize)
)

// held is the memory a layer read whole holds until its processor closes.
type held struct{ bufs []*[]byte }

// take adds b, already counted in the budget, to what is held.
func (h *held) take(b *[]byte) { h.bufs = append(h.bufs, b) }

// release gives back b.
func (h *held) release(b *[]byte) {
	h.bufs = slices.DeleteFunc(h.bufs, func(x *[]byte) bool { return x == b })
	putBuf(b)
}

// releaseAll gives everything back.
func (h *held) releaseAll() {
	for len(h.bufs) > 0 {
		h.release(h.bufs[0])
	}
}

// readWhole reads a gzip layer from br and inflates it whole if it can;
// size is its blob's, 0 when not known (WithBlobSize).
// It returns the tar stream when it could; otherwise the stream to inflate
// as before, which starts with whatever readWhole read. Either way h holds
// the memory to give back when the layer is closed; on error, nothing.
func readWhole(br *bufio.Reader, size int64, h *held) (tar *bytes.Reader, compressed io.Reader, err error) {
	if !wholeLayers {
		return nil, br, nil
	}
	blob, complete, err := readBlob(br, size, h)
	if err != nil {
		h.releaseAll()
		return nil, nil, err
	}
	if blob == nil {
		return nil, br, nil
	}
	if !complete {
		return nil, io.MultiReader(bytes.NewReader(*blob), br), nil
	}
	streamed := bytes.NewReader(*blob)
	if len(*blob) < gzipMinSize {
		return nil, streamed, nil
	}
	// The trailer's ISIZE: the tar stream's length modulo 2³². A member
	// that inflates to more does not fit, and is streamed.
	tarSize := int(binary.LittleEndian.Uint32((*blob)[len(*blob)-4:]))
	if tarSize > maxTar {
		return nil, streamed, nil
	}
	out := getBuf(tarSize)
	if out == nil {
		return nil, streamed, nil
	}
	h.take(out)
	n, ok := inflate((*out)[:tarSize], *blob)
	if !ok {
		h.release(out)
		return nil, streamed, nil
	}
	h.release(blob)
	return bytes.NewReader((*out)[:n]), nil, nil
}

// gzipMinSize is a gzip member's header and trailer: a shorter blob is
// broken, and streaming it says so.
const gzipMinSize = 18

// readBlob reads br to its end into a buffer of the budget's, up to
// maxBlob. complete is false when the blob is larger; blob is nil when
// the budget had no room to start, or when size, the blob's size if
// known, is already more than maxBlob.
func readBlob(br *bufio.Reader, size int64, h *held) (blob *[]byte, complete bool, err error) {
	// Not known, the smallest buffer; it doubles as the blob turns out
	// larger.
	first := 1 << minBufShift
	if size > 0 {
		if size > int64(maxBlob) {
			return nil, false, nil
		}
		first = int(size)
	}
	blob = wholeBuf(first)
	if blob == nil {
		return nil, false, nil
	}
	h.take(blob)
	n := 0
	for {
		if n == len(*blob) {
			// A full buffer may be full at the blob's end: a size told
			// exactly can be a buffer's size.
			_, err := br.Peek(1)
			if errors.Is(err, io.EOF) {
				return blob, true, nil
			}
			if err != nil {
				return nil, false, err
			}
			if n >= maxBlob {
				return blob, false, nil
			}
			bigger := wholeBuf(min(2*n, maxBlob))
			if bigger == nil {
				return blob, false, nil
			}
			h.take(bigger)
			copy(*bigger, (*blob)[:n])
			h.release(blob)
			blob = bigger
		}
		m, err := br.Read((*blob)[n:])
		n += m
		if errors.Is(err, io.EOF) {
			*blob = (*blob)[:n]
			return blob, true, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
}

// wholeBuf is a buffer for at least n bytes of a blob, as long as its
// capacity (a power of two) allows, up to maxBlob: a blob told too
// little of its size fills the buffer before it moves to a larger one.
func wholeBuf(n int) *[]byte {
	b := getBuf(n)
	if b != nil {
		*b = (*b)[:min(cap(*b), maxBlob)]
	}
	return b
}

// Buffers come in powers of two from 1 MiB. A buffer given back is kept,
// by size, for the next layer of about its size: fresh memory costs the
// page faults of every byte written to it. Kept buffers stay counted in the
// budget, and are unmapped when a buffer of another size needs the room.
//
// They are mapped outside the Go heap: in it, the collector lets the heap
// grow to twice what is live before it collects, so the daemon's peak
// resident memory would grow by about twice the budget, whatever the
// budget. Mapped, the budget is what they can take.
const minBufShift = 20

var kept struct {
	mu   sync.Mutex
	bufs [bits.UintSize][]*[]byte // by size class
}

// getBuf returns a buffer of len n from the budget, or nil when the budget
// has no room for it.
func getBuf(n int) *[]byte {
	shift := max(bits.Len(uint(max(n, 1)-1)), minBufShift)
	size := 1 << shift
	kept.mu.Lock()
	if list := kept.bufs[shift]; len(list) > 0 {
		b := list[len(list)-1]
		kept.bufs[shift] = list[:len(list)-1]
		kept.mu.Unlock()
		*b = (*b)[:n]
		return b
	}
	kept.mu.Unlock()
	for !budget.TryAcquire(int64(size)) {
		if !unmapKept() {
			return nil
		}
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		budget.Release(int64(size))
		return nil
	}
	hugePages(mem)
	b := &mem
	*b = (*b)[:n]
	return b
}

// hugePages asks that mem be backed by huge pages where transparent huge
// pages are on only for those who ask ("madvise", Debian's and Ubuntu's
// default). Memory new to the process costs a page fault per page it
// writes, and a layer written whole into 4 KiB pages pays one fault per
// 4 KiB of the blob and of the tar: on a paravirtualized guest that was
// several times what inflating the layer costs (BenchmarkLayerFromFile,
// whole-fresh), and a node's first pulls write into nothing but new
// memory. In 2 MiB pages a buffer of 2 MiB or more takes 512 times fewer
// faults in its 2 MiB-aligned part, which is all of it where the kernel
// aligns such mappings (Linux 6.7 and later). Where huge pages are always
// on, the advice only lets a fault compact memory to find one (defrag's
// default); where they are off or the kernel lacks them, it changes
// nothing, and its error is of no consequence.
func hugePages(mem []byte) {
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
}

// putBuf keeps b for a later layer, still counted in the budget.
func putBuf(b *[]byte) {
	*b = (*b)[:cap(*b)]
	shift := bits.Len(uint(cap(*b) - 1))
	kept.mu.Lock()
	kept.bufs[shift] = append(kept.bufs[shift], b)
	kept.mu.Unlock()
}

// unmapKept unmaps one kept buffer, the largest, and gives its share of
// the budget back; false when none is kept.
func unmapKept() bool {
	kept.mu.Lock()
	var b *[]byte
	for shift := len(kept.bufs) - 1; shift >= minBufShift && b == nil; shift-- {
		if list := kept.bufs[shift]; len(list) > 0 {
			b = list[len(list)-1]
			kept.bufs[shift] = list[:len(list)-1]
		}
	}
	kept.mu.Unlock()
	if b == nil {
		return false
	}
	size := cap(*b)
	_ = unix.Munmap((*b)[:size]) // only fails for memory it did not map
	budget.Release(int64(size))
	return true
}
