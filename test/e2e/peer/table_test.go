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

// setLatency records p50 / p99; the ratio compares p50s.
func (t *table) setLatency(row string, d *driver, samples []time.Duration) {
	p50, p99 := percentile(samples, 0.5), percentile(samples, 0.99)
	t.set(row, d, fmt.Sprintf("%s / %s", ms(p50), ms(p99)), float64(p50))
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
	return fmt.Sprintf("%.2fx", last.value/first.value)
}
