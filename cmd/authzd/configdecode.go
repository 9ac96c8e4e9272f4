package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/fcd-authz/fcd/manifest"
	"sigs.k8s.io/yaml"
)

// errConfig: the configuration file is not one authzd can run with; the
// message says which setting and why, in the file's own terms.
var errConfig = errors.New("invalid configuration")

// decodeConfig decodes a YAML (or JSON) configuration over c, refusing
// unknown settings, and explains a failure by the setting's name — not by
// the Go field or the decoder that failed.
func decodeConfig(data []byte, c *Config) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("%w: not valid YAML: %s", errConfig, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return nil // an empty file sets nothing
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	err = dec.Decode(c)
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return fmt.Errorf("%w: the file must be a map of settings", errConfig)
	case errors.As(err, &typeErr):
		return fmt.Errorf("%w: setting %q must be %s, not %s", errConfig, typeErr.Field, kindName(typeErr.Type), typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		msg := fmt.Sprintf("%v: unknown setting %q", errConfig, name)
		if near := nearestSetting(name); near != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", near)
		}
		return errors.New(msg)
	case strings.HasPrefix(err.Error(), "json: cannot unmarshal"):
		return fmt.Errorf("%w: the file must be a map of settings", errConfig)
	}
	// A setting's own check (a duration that is not one).
	return fmt.Errorf("%w: %v", errConfig, err)
}

// kindName names what a setting of type t takes.
func kindName(t reflect.Type) string {
	switch {
	case t == reflect.TypeOf(Duration(0)):
		return "a duration like 30s or 15m"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "a whole number"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.Slice:
		return "a list of " + strings.TrimPrefix(kindName(t.Elem()), "a ") + "s"
	}
	return t.Kind().String()
}

// settingNames are the configuration's settings (the json names of
// Config's fields), sorted.
func settingNames() []string {
	var names []string
	t := reflect.TypeOf(Config{})
	for i := range t.NumField() {
		if n, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); n != "" && n != "-" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// nearestSetting is the setting name closest to name, "" when none is
// near: the suggestion the API makes for a misspelt member
// ([manifest.NearestName]), over the configuration's settings.
func nearestSetting(name string) string {
	return manifest.NearestName(name, settingNames())
}
