package peer

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// table is the side-by-side result: one row per measurement, one column
// per driver, and NVIDIA's value over ours where both are numbers (above 1:
// we are ahead on a row where less is better, as on every row here).
type table struct {
	header  []string
	drivers []*driver
	rows    []string
	cells   map[string]map[*driver]cell
}

type cell struct {
	text  string
	value float64 // what the ratio compares; 0: none
	tail  float64 // a latency's p99, compared too; 0: none
}

func (t *table) set(row string, d *driver, text string, value float64) {
	if t.cells == nil {
		t.cells = map[string]map[*driver]cell{}
	}
	if t.cells[row] == nil {
		t.cells[row] = map[*driver]cell{}
		t.rows = append(t.rows, row)
	}
	t.cells[row][d] = cell{text: text, value: value}
}

// setTail adds a row's second figure to compare (a latency's p99).
func (t *table) setTail(row string, d *driver, tail float64) {
	c := t.cells[row][d]
	c.tail = tail
	t.cells[row][d] = c
}

// setLatency records p50 / p99; the ratio compares both.
func (t *table) setLatency(row string, d *driver, samples []time.Duration) {
	p50, p99 := percentile(samples, 0.5), percentile(samples, 0.99)
	t.set(row, d, fmt.Sprintf("%s / %s", ms(p50), ms(p99)), float64(p50))
	t.setTail(row, d, float64(p99))
}

// print writes the table as Markdown, ready for BENCHMARKS.md.
func (t *table) print(w io.Writer) {
	for _, h := range t.header {
		_, _ = fmt.Fprintln(w, h)
	}
	heads := []string{"row"}
	for _, d := range t.drivers {
		heads = append(heads, d.label)
	}
	heads = append(heads, fmt.Sprintf("%s / %s", t.drivers[len(t.drivers)-1].label, t.drivers[0].label))
	_, _ = fmt.Fprintf(w, "\n| %s |\n|%s\n", strings.Join(heads, " | "), strings.Repeat("---|", len(heads)))
	for _, row := range t.rows {
		line := []string{row}
		for _, d := range t.drivers {
			line = append(line, t.cells[row][d].text)
		}
		line = append(line, t.ratio(row))
		_, _ = fmt.Fprintf(w, "| %s |\n", strings.Join(line, " | "))
	}
}

func (t *table) ratio(row string) string {
	first, last := t.cells[row][t.drivers[0]], t.cells[row][t.drivers[len(t.drivers)-1]]
	if first.value == 0 || last.value == 0 {
		return ""
	}
	if first.tail == 0 || last.tail == 0 {
		return fmt.Sprintf("%.2fx", last.value/first.value)
	}
	return fmt.Sprintf("%.2fx / %.2fx", last.value/first.value, last.tail/first.tail)
}

// printSpread writes, per row of the tables (one per run of the same
// rows), each run's ratios and the smallest of them: a claim of being
// ahead holds only if it holds in every run, at p50 and at p99.
func printSpread(w io.Writer, runs []*table) {
	if len(runs) == 0 {
		return
	}
	_, _ = fmt.Fprintf(w, "\n| row | ratio per run (p50 / p99) | smallest p50 / p99 |\n|---|---|---|\n")
	for _, row := range runs[0].rows {
		var each []string
		low50, low99 := 0.0, 0.0
		for i, t := range runs {
			each = append(each, t.ratio(row))
			first, last := t.cells[row][t.drivers[0]], t.cells[row][t.drivers[len(t.drivers)-1]]
			if first.value == 0 || first.tail == 0 {
				continue
			}
			r50, r99 := last.value/first.value, last.tail/first.tail
			if i == 0 || r50 < low50 {
				low50 = r50
			}
			if i == 0 || r99 < low99 {
				low99 = r99
			}
		}
		_, _ = fmt.Fprintf(w, "| %s | %s | %.2fx / %.2fx |\n", row, strings.Join(each, ", "), low50, low99)
	}
}
