package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/server"
)

// TestEverySettingReachesTheServer: each setting of the configuration
// (but those of the command alone: dev, signingAlg, logLevel, logFormat) is carried
// to the server.Config field of the same name, and the flags' defaults
// are the server's: a configuration of the defaults maps onto the zero
// server.Config's defaults.
func TestEverySettingReachesTheServer(t *testing.T) {
	commandOnly := map[string]bool{"Dev": true, "SigningAlg": true, "LogLevel": true, "LogFormat": true}
	var c Config
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		f := reflect.ValueOf(&c).Elem().Field(i)
		switch f.Interface().(type) {
		case string:
			f.SetString("x")
		case int64:
			f.SetInt(7)
		case float64:
			f.SetFloat(0.5)
		case Duration:
			f.SetInt(int64(time.Minute))
		case bool:
			f.SetBool(true)
		case []string:
			f.Set(reflect.ValueOf([]string{"k=v"}))
		default:
			t.Fatalf("field %s: no sample value for %s", typ.Field(i).Name, f.Type())
		}
	}
	got := reflect.ValueOf(c.server(nil, nil))
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		if commandOnly[name] {
			continue
		}
		sf := got.FieldByName(name)
		if !sf.IsValid() {
			t.Errorf("setting %s has no server.Config field", name)
			continue
		}
		want := reflect.ValueOf(c).Field(i).Interface()
		if d, ok := want.(Duration); ok {
			want = time.Duration(d)
		}
		if !reflect.DeepEqual(sf.Interface(), want) {
			t.Errorf("setting %s: server.Config has %#v, want %#v", name, sf.Interface(), want)
		}
	}

	// The flags' defaults are the server's.
	var d Config
	bindServeFlags(&d)
	sc := d.server(nil, nil)
	if sc.Listen != server.DefaultListen || sc.DataDir != server.DefaultDataDir || sc.FormationRate != server.DefaultFormationRate ||
		sc.FormationBurst != server.DefaultFormationBurst || sc.BodyLimit != server.DefaultBodyLimit ||
		sc.FormationTTL != server.DefaultFormationTTL || sc.FormationRetention != server.DefaultFormationRetention ||
		sc.ReportGrace != server.DefaultReportGrace || sc.TokenLifetime != server.DefaultTokenLifetime ||
		sc.PolicyPoll != server.DefaultPolicyPoll || sc.Issuer != server.DefaultIssuer ||
		sc.GatewayCaller != server.DefaultGatewayCaller || sc.AuditArguments != server.DefaultAuditArguments ||
		!reflect.DeepEqual(sc.DecisionLogMask, []string{server.DefaultDecisionLogMask}) {
		t.Errorf("the flags' defaults are not the server's: %+v", sc)
	}
	// --formation-rate 0 is no limit.
	d.FormationRate = 0
	if r := d.server(nil, nil).FormationRate; r != server.NoFormationLimit {
		t.Errorf("--formation-rate 0 maps to %v, want NoFormationLimit", r)
	}
}
