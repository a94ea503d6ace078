package testserver

import (
	"strings"
	"testing"
	"time"
)

// A test's configuration reaches the server only through serverSettingsFrom: what it translates
// comes through, and any other change is refused rather than silently dropped.
func TestServerSettingsTranslateOrRefuse(t *testing.T) {
	cfg := NewTestConfig(t)
	settings, err := serverSettingsFrom(cfg)
	if err != nil || settings.watchProgressNotifyInterval != 0 {
		t.Fatalf("untouched config: %+v, %v", settings, err)
	}

	cfg.WatchProgressNotifyInterval = time.Second
	settings, err = serverSettingsFrom(cfg)
	if err != nil || settings.watchProgressNotifyInterval != time.Second {
		t.Fatalf("progress interval: %+v, %v", settings, err)
	}

	cfg.SnapshotCount = 5
	if _, err := serverSettingsFrom(cfg); err == nil || !strings.Contains(err.Error(), "SnapshotCount") {
		t.Fatalf("an untranslated field must be refused, got %v", err)
	}
}
