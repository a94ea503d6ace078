// Command tally reads the `go test -json` results of one or more runs of the upstream storage
// tests (one file per server configuration, named on the command line as label=file) and prints
// pass/fail/skip counts per configuration, then each test whose outcome differs between them.
// It exits 1 if a configuration failed a test that the first configuration passed, or, given one
// configuration only or -strict first on the command line, if any configuration failed any test.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// event is the part of test2json's output tally reads.
type event struct {
	Action string
	Test   string
}

// run is one configuration's outcome per test (top-level tests and subtests alike).
type run struct {
	label    string
	outcomes map[string]string
}

func main() {
	args := os.Args[1:]
	strict := len(args) > 0 && args[0] == "-strict"
	if strict {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: tally [-strict] label=results.json ...")
		os.Exit(2)
	}
	var runs []run
	for _, arg := range args {
		label, file, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "tally: %q is not label=file\n", arg)
			os.Exit(2)
		}
		outcomes, err := readOutcomes(file)
		if err != nil {
			fmt.Fprintf(os.Stderr, "tally: %s: %v\n", file, err)
			os.Exit(2)
		}
		runs = append(runs, run{label: label, outcomes: outcomes})
	}
	printCounts(runs)
	regressions := printDifferences(runs)
	if failed(runs, regressions, strict) {
		os.Exit(1)
	}
}

// failed says whether the runs fail the check: a regression against the reference (the first run)
// always does; any failure does when there is no reference to compare against (one run) or when
// every test is expected to pass (strict: a set that the reference server passes whole).
func failed(runs []run, regressions int, strict bool) bool {
	if regressions > 0 {
		return true
	}
	if strict || len(runs) == 1 {
		for _, r := range runs {
			if failures(r) > 0 {
				return true
			}
		}
	}
	return false
}

func failures(r run) int {
	n := 0
	for _, outcome := range r.outcomes {
		if outcome == "fail" {
			n++
		}
	}
	return n
}

// readOutcomes keeps each test's last pass, fail or skip; a test that started and never ended
// (the binary timed out or crashed) counts as failed.
func readOutcomes(file string) (map[string]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	outcomes := map[string]string{}
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<26)
	for scanner.Scan() {
		var e event
		if json.Unmarshal(scanner.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		switch e.Action {
		case "run":
			outcomes[e.Test] = "fail"
		case "pass", "fail", "skip":
			outcomes[e.Test] = e.Action
		}
	}
	return outcomes, scanner.Err()
}

func printCounts(runs []run) {
	fmt.Printf("| configuration | top-level pass / fail / skip | all (with subtests) pass / fail / skip |\n| --- | --- | --- |\n")
	for _, r := range runs {
		var top, all [3]int
		for name, outcome := range r.outcomes {
			i := map[string]int{"pass": 0, "fail": 1, "skip": 2}[outcome]
			all[i]++
			if !strings.Contains(name, "/") {
				top[i]++
			}
		}
		fmt.Printf("| %s | %d / %d / %d | %d / %d / %d |\n", r.label, top[0], top[1], top[2], all[0], all[1], all[2])
	}
}

// printDifferences lists every test whose outcome is not the same in all runs and returns how
// many failed somewhere although the first run passed them.
func printDifferences(runs []run) int {
	names := map[string]bool{}
	for _, r := range runs {
		for name := range r.outcomes {
			names[name] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	sort.Strings(sorted)
	regressions := 0
	header := false
	for _, name := range sorted {
		var outcomes []string
		same := true
		for _, r := range runs {
			o := r.outcomes[name]
			if o == "" {
				o = "not run"
			}
			outcomes = append(outcomes, r.label+": "+o)
			same = same && o == orNotRun(runs[0].outcomes[name])
			if r.label != runs[0].label && runs[0].outcomes[name] == "pass" && o == "fail" {
				regressions++
			}
		}
		if same {
			continue
		}
		if !header {
			fmt.Printf("\ndifferences:\n")
			header = true
		}
		fmt.Printf("  %s: %s\n", name, strings.Join(outcomes, ", "))
	}
	return regressions
}

func orNotRun(o string) string {
	if o == "" {
		return "not run"
	}
	return o
}
