package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This host stalls for tens of milliseconds several times per ten seconds,
// and a single run puts a figure on either side of its target. So a target
// is judged on the median of a figure measured in several runs of the same
// invocation, interleaved with the runs of what it is divided by, and
// printed with the spread of those runs (judgeRuns).

// median is the middle of vs (the mean of the two middle ones for an even
// count), NaN for none. vs is left as it was.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// judgeRuns is the target name held to want by cmp (">=" or "<="), on the
// median of runs, each run's figure in the order they ran.
func judgeRuns(name string, runs []float64, cmp string, want float64) Target {
	v := median(runs)
	met := v >= want
	if cmp == "<=" {
		met = v <= want
	}
	return Target{Name: name, Value: v, Runs: slices.Clone(runs), Cmp: cmp, Want: want, Met: met}
}

// spread is how Print shows a target's runs: each figure, in the order
// they ran, up to five; their least and greatest beyond.
func (t Target) spread() string {
	switch n := len(t.Runs); {
	case n == 0:
		return ""
	case n == 1:
		return "(1 run)"
	case n <= 5:
		vs := make([]string, n)
		for i, v := range t.Runs {
			vs[i] = strconv.FormatFloat(v, 'f', 3, 64)
		}
		return fmt.Sprintf("(%d runs: %s)", n, strings.Join(vs, " "))
	default:
		return fmt.Sprintf("(%d runs: %.3f–%.3f)", n, slices.Min(t.Runs), slices.Max(t.Runs))
	}
}

// mark is Print's verdict of t: met, or missed with how far off.
func (t Target) mark() string {
	if t.Met {
		return "met"
	}
	gap := t.Value / t.Want
	if t.Cmp == "<=" {
		gap = t.Want / t.Value
	}
	return fmt.Sprintf("MISSED (at %.0f%% of the target)", 100*gap)
}

// line is t as Print writes it, and ParseTargets reads it back.
func (t Target) line() string {
	s := fmt.Sprintf("target %-66s %10.3f %s %-8g %s", t.Name, t.Value, t.Cmp, t.Want, t.mark())
	if sp := t.spread(); sp != "" {
		s += "  " + sp
	}
	return s
}

// targetLine matches a line of Print's targets: the name, the value, the
// comparison, the target, the verdict, and the runs where it has them
// (BENCHMARKS.md before the medians has none).
var targetLine = regexp.MustCompile(`^target (.+?)\s+(-?[0-9.]+|NaN|[+-]Inf) (>=|<=) (\S+)\s+(met|MISSED \(at [0-9]+% of the target\))(?:\s+\((\d+) runs?(?:: ([^)]*))?\))?\s*$`)

// ParseTargets reads the target lines of an earlier report (Print's, or
// BENCHMARKS.md with Print's output in it), in their order; the other
// lines are skipped. The runs of a line with a least and a greatest only
// are those two.
func ParseTargets(r io.Reader) ([]Target, error) {
	var ts []Target
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "target ") {
			continue
		}
		m := targetLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("a target line that does not read: %q", line)
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("target %q: value %w", m[1], err)
		}
		want, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			return nil, fmt.Errorf("target %q: target %w", m[1], err)
		}
		t := Target{Name: strings.TrimSpace(m[1]), Value: v, Cmp: m[3], Want: want, Met: m[5] == "met"}
		for _, f := range strings.FieldsFunc(m[7], func(r rune) bool { return r == ' ' || r == '–' }) {
			x, err := strconv.ParseFloat(f, 64)
			if err != nil {
				return nil, fmt.Errorf("target %q: run %w", t.Name, err)
			}
			t.Runs = append(t.Runs, x)
		}
		if m[6] == "1" && len(t.Runs) == 0 {
			t.Runs = []float64{v}
		}
		ts = append(ts, t)
	}
	return ts, sc.Err()
}

// Change is one target of this run next to the same target (by name) in
// an earlier report: Before is nil for a new target, Now for one this run
// did not judge.
type Change struct {
	Name   string  `json:"name"`
	Before *Target `json:"before,omitempty"`
	Now    *Target `json:"now,omitempty"`
}

// changes pairs the targets of now with those of before by name, in the
// order of now, then those of before that now lacks.
func changes(before, now []Target) []Change {
	old := map[string]*Target{}
	for i := range before {
		old[before[i].Name] = &before[i]
	}
	var cs []Change
	seen := map[string]bool{}
	for i := range now {
		t := &now[i]
		cs = append(cs, Change{Name: t.Name, Before: old[t.Name], Now: t})
		seen[t.Name] = true
	}
	for i := range before {
		if b := &before[i]; !seen[b.Name] {
			cs = append(cs, Change{Name: b.Name, Before: b})
		}
	}
	return cs
}

// String is the change as one line: before → now, with the target when it
// moved, and the factor between the two figures.
func (c Change) String() string {
	side := func(t *Target, other *Target) string {
		s := fmt.Sprintf("%.3f %s", t.Value, verdict(t.Met))
		if other == nil || other.Cmp != t.Cmp || other.Want != t.Want {
			s = fmt.Sprintf("%.3f (%s %g) %s", t.Value, t.Cmp, t.Want, verdict(t.Met))
		}
		return s
	}
	switch {
	case c.Before == nil:
		return fmt.Sprintf("%s: new, %s", c.Name, side(c.Now, nil))
	case c.Now == nil:
		return fmt.Sprintf("%s: %s, not judged in this run", c.Name, side(c.Before, nil))
	}
	s := fmt.Sprintf("%s: %s → %s", c.Name, side(c.Before, c.Now), side(c.Now, c.Before))
	if c.Before.Value != 0 {
		s += fmt.Sprintf(" (×%.2f)", c.Now.Value/c.Before.Value)
	}
	return s
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}

// medianRun is the run of runs at the middle by key (the lower of the two
// middle ones for an even count): the run whose figures a report prints
// beside the medians. runs must not be empty.
func medianRun[T any](runs []T, key func(T) float64) T {
	idx := make([]int, len(runs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmpFloat(key(runs[a]), key(runs[b])) })
	return runs[idx[(len(idx)-1)/2]]
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// blockPercentiles splits ds, in the order they were measured, into n
// runs of about equal length (n at most len(ds)), and returns the
// percentiles of each; ds is left as it was.
func blockPercentiles(ds []time.Duration, n int) []Percentiles {
	n = min(n, len(ds))
	var ps []Percentiles
	for k := range n {
		ps = append(ps, percentilesOf(slices.Clone(ds[k*len(ds)/n:(k+1)*len(ds)/n])))
	}
	return ps
}

// blockP99s is the p99 in ms of each of n runs of ds (blockPercentiles).
func blockP99s(ds []time.Duration, n int) []float64 {
	var vs []float64
	for _, p := range blockPercentiles(ds, n) {
		vs = append(vs, p.P99)
	}
	return vs
}

// blockP50s is the p50 in ms of each of n runs of ds (blockPercentiles).
func blockP50s(ds []time.Duration, n int) []float64 {
	var vs []float64
	for _, p := range blockPercentiles(ds, n) {
		vs = append(vs, p.P50)
	}
	return vs
}
