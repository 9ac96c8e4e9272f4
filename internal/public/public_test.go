package public_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fcd-authz/fcd/internal/public"
)

func TestError(t *testing.T) {
	errGone := public.New("lease", "epoch not found")
	wrapped := fmt.Errorf("get e: %w", errGone)
	if !errors.Is(wrapped, errGone) {
		t.Fatal("errors.Is does not see the sentinel")
	}
	if errGone.Error() != "lease: epoch not found" {
		t.Errorf("Error() = %q", errGone.Error())
	}
	if text, ok := public.Text(errGone); !ok || text != "epoch not found" {
		t.Errorf("Text = %q, %v", text, ok)
	}
	if _, ok := public.Text(wrapped); ok {
		t.Error("a wrapper's text is not public by itself")
	}
	if e := public.New("", "no such route"); e.Error() != "no such route" {
		t.Errorf("Error() = %q", e.Error())
	}
}
