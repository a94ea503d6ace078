package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A test that started and never ended (the binary crashed or timed out) counts as failed, and a
// later outcome replaces an earlier one.
func TestReadOutcomes(t *testing.T) {
	file := filepath.Join(t.TempDir(), "results.json")
	lines := `{"Action":"run","Test":"TestA"}
{"Action":"pass","Test":"TestA"}
{"Action":"run","Test":"TestB"}
{"Action":"run","Test":"TestC"}
{"Action":"skip","Test":"TestC"}
not json
{"Action":"output","Output":"FAIL\n"}
`
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	outcomes, err := readOutcomes(file)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"TestA": "pass", "TestB": "fail", "TestC": "skip"}
	if len(outcomes) != len(want) {
		t.Fatalf("got %v, want %v", outcomes, want)
	}
	for name, outcome := range want {
		if outcomes[name] != outcome {
			t.Errorf("%s: got %q, want %q", name, outcomes[name], outcome)
		}
	}
}

// Without -strict a failure the reference shares is no regression; with it, any failure fails, so a
// run of keyward's configurations alone cannot pass with a test failing on all of them.
func TestFailed(t *testing.T) {
	reference := run{label: "keyward:1", outcomes: map[string]string{"TestA": "pass", "TestB": "fail"}}
	other := run{label: "keyward:3", outcomes: map[string]string{"TestA": "pass", "TestB": "fail"}}
	runs := []run{reference, other}
	if failed(runs, 0, false) {
		t.Error("a failure shared with the reference failed the check without -strict")
	}
	if !failed(runs, 0, true) {
		t.Error("a failure passed the check with -strict")
	}
	if !failed(runs[:1], 0, false) {
		t.Error("a failure of a lone configuration passed the check")
	}
	if !failed(runs, 1, false) {
		t.Error("a regression passed the check")
	}
	passing := run{label: "keyward:1", outcomes: map[string]string{"TestA": "pass", "TestC": "skip"}}
	if failed([]run{passing, passing}, 0, true) {
		t.Error("runs with no failure failed the check with -strict")
	}
}
