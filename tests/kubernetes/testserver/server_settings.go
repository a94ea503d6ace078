// The embedded server's configuration turned into a real server's flags: the fields the upstream
// tests set, translated, and a refusal of any other change, so a test never runs silently against
// a server configured other than it asked.
package testserver

import (
	"fmt"
	"reflect"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// serverSettings is what a test may ask of the server beyond the deployment.
type serverSettings struct {
	// watchProgressNotifyInterval, when non-zero, is how often the server sends progress
	// notifications to watches that asked for them.
	watchProgressNotifyInterval time.Duration
}

// serverSettingsFrom reads the fields the tests set and checks that every other plain field is as
// NewTestConfig left it.
func serverSettingsFrom(cfg *embed.Config) (serverSettings, error) {
	settings := serverSettings{watchProgressNotifyInterval: cfg.WatchProgressNotifyInterval}

	probe := *cfg
	untouched := embed.NewConfig()
	probe.WatchProgressNotifyInterval = untouched.WatchProgressNotifyInterval
	probe.Dir = untouched.Dir
	if field, differs := firstDifferentPlainField(&probe, untouched); differs {
		return settings, fmt.Errorf("testserver: the test sets embed.Config.%s, which this test server does not translate into a server flag", field)
	}
	return settings, nil
}

// firstDifferentPlainField compares the exported bool, number and string fields of two configs
// (funcs, pointers, slices and maps are left out: they hold loggers, URLs and TLS state that
// differ between any two configs).
func firstDifferentPlainField(a, b *embed.Config) (string, bool) {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for i := 0; i < va.NumField(); i++ {
		field := va.Type().Field(i)
		if !field.IsExported() {
			continue
		}
		switch field.Type.Kind() {
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
			reflect.Float32, reflect.Float64, reflect.String:
			if va.Field(i).Interface() != vb.Field(i).Interface() {
				return field.Name, true
			}
		}
	}
	return "", false
}
