package kubelet

import (
	"testing"

	"github.com/pullwise/pullwise/integration/corpus"
)

// The unseen corpus (corpus.Giant, Flood, Deep, Compressions) as pods
// under a real kubelet, as benchKubeletCorpus runs the first corpus.

// BenchmarkKubeletCorpusUnseenGiant: a pod of an image of about 1 GiB
// written first, with 15 sidecar pods of 1-3 MiB images. It also reports
// the small pods' median and the big pod's time.
func BenchmarkKubeletCorpusUnseenGiant(b *testing.B) {
	benchKubeletCorpus(b, "unseen-giant", corpus.Giant)
}

// BenchmarkKubeletCorpusUnseenFlood: 40 pods of 1-5 MiB images.
func BenchmarkKubeletCorpusUnseenFlood(b *testing.B) {
	benchKubeletCorpus(b, "unseen-flood", corpus.Flood)
}

// BenchmarkKubeletCorpusUnseenDeep: four pods of images of 60 small
// layers.
func BenchmarkKubeletCorpusUnseenDeep(b *testing.B) {
	benchKubeletCorpus(b, "unseen-deep", corpus.Deep)
}

// BenchmarkKubeletCorpusUnseenCompressions: six pods of images gzipped at
// level 1, 9 or the default, or zstd-compressed.
func BenchmarkKubeletCorpusUnseenCompressions(b *testing.B) {
	benchKubeletCorpus(b, "unseen-compressions", corpus.Compressions)
}
