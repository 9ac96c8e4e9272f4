package audit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// FormationHistory returns what every chain under root recorded of one
// formation, merged by etcd revision: its formation event (the call, its
// digests and its decision), approvals and denials, admissions, and the
// claims, outcomes and resolutions of its leases. etcd collects a closed
// formation once its retention ends; this is where it is kept after.
//
// It reads the files as they are; Verify proves them intact.
func FormationHistory(root, id string) ([]Event, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	var all []Event
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		files, err := trailFiles(filepath.Join(root, e.Name()))
		if err != nil {
			return nil, err
		}
		for _, path := range files {
			lines, _, err := readLines(path)
			if err != nil {
				return nil, err
			}
			for _, line := range lines {
				var ev Event
				if json.Unmarshal(line, &ev) == nil && ev.Kind != "" {
					all = append(all, ev)
				}
			}
		}
	}
	slices.SortStableFunc(all, func(a, b Event) int { return cmp.Compare(a.Revision, b.Revision) })
	all = distinctEvents(all)
	type refs struct {
		ID        string `json:"id"`
		Formation string `json:"formation"`
		Lease     string `json:"lease"`
	}
	ds := make([]refs, len(all))
	leases := map[string]bool{} // the formation's, from its admissions
	for i, ev := range all {
		if json.Unmarshal(ev.Data, &ds[i]) == nil && ev.Kind == "admission" && ds[i].Formation == id {
			leases[ds[i].Lease] = true
		}
	}
	var out []Event
	for i, ev := range all {
		d := ds[i]
		switch ev.Kind {
		case "formation":
			if d.ID != id {
				continue
			}
		case "approval", "admission", "readmission":
			if d.Formation != id {
				continue
			}
		case "claim", "outcome", "resolution":
			if d.Formation != id && !leases[d.Lease] {
				continue
			}
		default:
			continue
		}
		out = append(out, ev)
	}
	return out, nil
}

// distinctEvents is distinct for events sorted by revision.
func distinctEvents(all []Event) []Event {
	ps := make([]placed, len(all))
	for i, ev := range all {
		ps[i] = placed{Event: ev}
	}
	ps = distinct(ps)
	out := make([]Event, len(ps))
	for i, p := range ps {
		out[i] = p.Event
	}
	return out
}
