package kubelet

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// span is one CRI call's start and end, from CRI's own log lines, which
// stock containerd writes as Pullwise does; zero where a line is missing.
type span struct{ start, end time.Time }

// podCalls are one pod's CRI calls.
type podCalls struct {
	name                    string
	sandbox, create, launch span
}

// criCalls splits the CRI call lines of a containerd log by pod, and the
// pulls by image, so that each pod's time to Running splits into its
// sandbox, its image's pull and the rest on either runtime. Pods come in
// the order they were Running, images in the order their pulls began.
func criCalls(log string) (pods []*podCalls, pulls map[string]*span, images []string) {
	byName := map[string]*podCalls{}
	bySandbox := map[string]*podCalls{}
	byContainer := map[string]*podCalls{}
	pulls = map[string]*span{}
	pod := func(name string) *podCalls {
		p := byName[name]
		if p == nil {
			p = &podCalls{name: name}
			byName[name] = p
			pods = append(pods, p)
		}
		return p
	}
	for line := range strings.Lines(log) {
		m := criLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		msg := strings.ReplaceAll(m[2], `\"`, `"`)
		switch {
		case strings.HasPrefix(msg, "RunPodSandbox for "):
			p := pod(firstQuoted(msg))
			mark(p, &p.sandbox, at, msg, "returns sandbox id ", bySandbox)
		case strings.HasPrefix(msg, "CreateContainer within sandbox "):
			if p := bySandbox[firstQuoted(msg)]; p != nil {
				mark(p, &p.create, at, msg, "returns container id ", byContainer)
			}
		case strings.HasPrefix(msg, "StartContainer for "):
			if p := byContainer[firstQuoted(msg)]; p != nil {
				mark(p, &p.launch, at, msg, "returns successfully", nil)
			}
		case strings.HasPrefix(msg, "PullImage "):
			ref := firstQuoted(msg)
			s := pulls[ref]
			if s == nil {
				s = &span{}
				pulls[ref] = s
				images = append(images, ref)
			}
			if strings.Contains(msg, "returns image reference") {
				s.end = at
			} else if s.start.IsZero() {
				s.start = at
			}
		}
	}
	slices.SortStableFunc(pods, func(a, b *podCalls) int { return compareSet(a.launch.end, b.launch.end) })
	slices.SortStableFunc(images, func(a, b string) int { return pulls[a].start.Compare(pulls[b].start) })
	return pods, pulls, images
}

// mark sets the start of one of p's calls from its line msg at at or, on
// the call's returns line, its end; the end names what p's next call
// refers to (its sandbox, its container).
func mark(p *podCalls, call *span, at time.Time, msg, returns string, next map[string]*podCalls) {
	id, ended := after(msg, returns)
	switch {
	case !ended:
		call.start = at
	case next != nil:
		next[id] = p
		fallthrough
	default:
		call.end = at
	}
}

// criLine matches a logrus text line: its time and its message.
var criLine = regexp.MustCompile(`^time="([^"]+)" level=\w+ msg="((?:[^"\\]|\\.)*)"`)

// firstQuoted is the first double-quoted string in msg.
func firstQuoted(msg string) string {
	_, rest, _ := strings.Cut(msg, `"`)
	s, _, _ := strings.Cut(rest, `"`)
	return s
}

// after is the quoted string after marker in msg.
func after(msg, marker string) (string, bool) {
	_, rest, ok := strings.Cut(msg, marker)
	if !ok {
		return "", false
	}
	return firstQuoted(rest), true
}

// compareSet orders times with unset ones last.
func compareSet(a, b time.Time) int {
	switch {
	case a.IsZero() && b.IsZero():
		return 0
	case a.IsZero():
		return 1
	case b.IsZero():
		return -1
	}
	return a.Compare(b)
}

// criCallTable renders criCalls as seconds from the first RunPodSandbox.
func criCallTable(log string) string {
	pods, pulls, images := criCalls(log)
	var t0 time.Time
	for _, p := range pods {
		if s := p.sandbox.start; !s.IsZero() && (t0.IsZero() || s.Before(t0)) {
			t0 = s
		}
	}
	at := func(t time.Time) string {
		if t.IsZero() || t0.IsZero() {
			return "     -"
		}
		return fmt.Sprintf("%6.2f", t.Sub(t0).Seconds())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CRI calls, s from the first RunPodSandbox\n%-28s %6s %6s %6s %6s %6s %6s\n", "pod", "sandbx", "ready", "create", "made", "start", "runs")
	for _, p := range pods {
		fmt.Fprintf(&b, "%-28.28s %s %s %s %s %s %s\n", p.name, at(p.sandbox.start), at(p.sandbox.end), at(p.create.start), at(p.create.end), at(p.launch.start), at(p.launch.end))
	}
	fmt.Fprintf(&b, "%-60s %6s %6s\n", "image", "pull", "pulled")
	for _, ref := range images {
		fmt.Fprintf(&b, "%-60.60s %s %s\n", ref, at(pulls[ref].start), at(pulls[ref].end))
	}
	return b.String()
}

// TestKubeletBenchCRICalls: CRI's own log lines, as containerd writes them, split by
// pod and by image, pods in the order they ran.
func TestKubeletBenchCRICalls(t *testing.T) {
	log := strings.Join([]string{
		`time="2026-11-27T11:00:40.000000000Z" level=info msg="PullImage \"reg/big:v1\""`,
		`time="2026-11-27T11:00:41.000000000Z" level=info msg="RunPodSandbox for name:\"bench0-e2e\"  uid:\"u0\"  namespace:\"default\""`,
		`time="2026-11-27T11:00:41.100000000Z" level=info msg="RunPodSandbox for name:\"bench1-e2e\"  uid:\"u1\"  namespace:\"default\""`,
		`time="2026-11-27T11:00:41.500000000Z" level=info msg="RunPodSandbox for name:\"bench1-e2e\"  uid:\"u1\"  namespace:\"default\" returns sandbox id \"sb1\""`,
		`time="2026-11-27T11:00:41.600000000Z" level=info msg="RunPodSandbox for name:\"bench0-e2e\"  uid:\"u0\"  namespace:\"default\" returns sandbox id \"sb0\""`,
		`time="2026-11-27T11:00:42.000000000Z" level=info msg="CreateContainer within sandbox \"sb0\" for container name:\"app\""`,
		`time="2026-11-27T11:00:42.200000000Z" level=info msg="CreateContainer within sandbox \"sb0\" for name:\"app\" returns container id \"c0\""`,
		`time="2026-11-27T11:00:42.300000000Z" level=info msg="StartContainer for \"c0\""`,
		`time="2026-11-27T11:00:42.400000000Z" level=info msg="StartContainer for \"c0\" returns successfully"`,
		`time="2026-11-27T11:00:43.000000000Z" level=info msg="PullImage \"reg/big:v1\" returns image reference \"sha256:aa\""`,
		`time="2026-11-27T11:00:43.000000000Z" level=info msg="image pull timeline" image="reg/big:v1"`,
		`not a log line`,
	}, "\n")
	pods, pulls, images := criCalls(log)
	if len(pods) != 2 || pods[0].name != "bench0-e2e" || pods[1].name != "bench1-e2e" {
		t.Fatalf("pods %v: want bench0-e2e, which ran, then bench1-e2e", pods)
	}
	base := time.Date(2026, 11, 27, 11, 0, 40, 0, time.UTC)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	want := podCalls{name: "bench0-e2e", sandbox: span{at(1000), at(1600)}, create: span{at(2000), at(2200)}, launch: span{at(2300), at(2400)}}
	if *pods[0] != want {
		t.Errorf("bench0-e2e: %+v, want %+v", *pods[0], want)
	}
	if got := *pods[1]; got.sandbox != (span{at(1100), at(1500)}) || !got.create.start.IsZero() {
		t.Errorf("bench1-e2e: %+v, want its sandbox only", got)
	}
	if len(images) != 1 || *pulls["reg/big:v1"] != (span{at(0), at(3000)}) {
		t.Errorf("pulls %v %v: want reg/big:v1 from 0 to 3 s", images, pulls)
	}
	if table := criCallTable(log); !strings.Contains(table, "bench0-e2e                     0.00   0.60   1.00   1.20   1.30   1.40") {
		t.Errorf("table:\n%s", table)
	}
}
