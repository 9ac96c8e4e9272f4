package record

import (
	"time"

	"github.com/fcd-authz/fcd/manifest"
)

// Certificate is a registered compatibility certificate.
type Certificate struct {
	ID           string                `json:"id"`
	Certificate  *manifest.Certificate `json:"certificate"`
	KeyID        string                `json:"signerKid"`
	JWS          string                `json:"jws"`
	RegisteredAt time.Time             `json:"registeredAt"`
	Revoked      bool                  `json:"revoked"`
	RevokedAt    *time.Time            `json:"revokedAt,omitempty"`
	// Revision is the etcd revision that last wrote the record; an
	// admission that relies on the certificate compares it, so a
	// revocation and the admission are ordered.
	Revision int64 `json:"-"`
}
