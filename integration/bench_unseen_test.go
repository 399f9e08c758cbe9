package integration

import (
	"testing"

	"github.com/pullwise/pullwise/integration/corpus"
)

// The unseen corpus (corpus.Giant, Flood, Deep, Compressions): shapes the
// scheduler was not tuned on, made to break smallest-first heuristics,
// against the same bounds as the first corpus's benchmarks.

// BenchmarkCorpusUnseenGiant: an image of about 1 GiB, its largest layer
// about 700 MiB, asked for first and at once with 15 sidecars of 1-3 MiB.
// Like BenchmarkCorpusBigAndSmall it also reports the small images' median
// and the big image's time.
func BenchmarkCorpusUnseenGiant(b *testing.B) {
	benchCorpus(b, "unseen-giant", corpus.Giant)
}

// BenchmarkCorpusUnseenFlood: a burst of 40 images of 1-5 MiB.
func BenchmarkCorpusUnseenFlood(b *testing.B) {
	benchCorpus(b, "unseen-flood", corpus.Flood)
}

// BenchmarkCorpusUnseenDeep: four images of 60 small layers, five of them
// shared.
func BenchmarkCorpusUnseenDeep(b *testing.B) {
	benchCorpus(b, "unseen-deep", corpus.Deep)
}

// BenchmarkCorpusUnseenCompressions: six images of 20-60 MiB whose layers
// are gzipped at level 1, 9 or the default, or zstd-compressed, two
// mixing them.
func BenchmarkCorpusUnseenCompressions(b *testing.B) {
	benchCorpus(b, "unseen-compressions", corpus.Compressions)
}
