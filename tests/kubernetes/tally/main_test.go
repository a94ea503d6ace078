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
