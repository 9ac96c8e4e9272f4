package client

import (
	"net/http"
	"testing"
	"time"
)

// TestProblemOf reads answers authzd does not give as problems too: a
// proxy's error page in front of it, an empty body, a JSON body that is
// not a problem document.
func TestProblemOf(t *testing.T) {
	cases := []struct {
		note        string
		status      int
		contentType string
		body        string
		header      map[string]string
		slug, title string
		detail      string
	}{
		{note: "a problem document", status: 409, contentType: "application/problem+json",
			body: `{"type":"` + ProblemTypeBase + `lease-claimed","title":"Lease already claimed","status":409,"detail":"another call claimed it","instance":"/v1/leases/ls_x/claim"}`,
			slug: "lease-claimed", title: "Lease already claimed", detail: "another call claimed it"},
		{note: "a proxy's HTML page", status: 502, contentType: "text/html",
			body: "<html>\n<head><title>502 Bad Gateway</title></head>\n</html>", title: "Bad Gateway", detail: "<html>"},
		{note: "an empty body, slug from the header", status: 503, header: map[string]string{"Fcd-Problem": "store-unavailable"},
			slug: "store-unavailable", title: "Service Unavailable"},
		{note: "a problem media type with a broken body", status: 500, contentType: "application/problem+json", body: `{"type":`,
			title: "Internal Server Error", detail: `{"type":`},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			h := http.Header{}
			if tc.contentType != "" {
				h.Set("Content-Type", tc.contentType)
			}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			p := problemOf(tc.status, h, []byte(tc.body))
			if p.Status != tc.status || p.Slug() != tc.slug || p.Title != tc.title || p.Detail != tc.detail {
				t.Fatalf("got status %d slug %q title %q detail %q, want %d %q %q %q", p.Status, p.Slug(), p.Title, p.Detail, tc.status, tc.slug, tc.title, tc.detail)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		value string
		want  time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{"-1", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"soon", 0},
	}
	for _, tc := range cases {
		if got := retryAfter(tc.value, now); got != tc.want {
			t.Errorf("Retry-After %q: %v, want %v", tc.value, got, tc.want)
		}
	}
}
