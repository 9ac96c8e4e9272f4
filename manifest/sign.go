package manifest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"os"

	"github.com/fcd-authz/fcd/internal/public"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// JWS "typ" header values of the documents fcd verifies. A verifier
// refuses a document whose typ is not the one it expects, so a signed
// manifest can never be replayed as another kind of document.
const (
	TypManifest = "fcd-manifest+jws"
	// TypResolution is the typ of an operator's signed resolution of an
	// uncertain lease ([Resolution]).
	TypResolution = "fcd-resolution+jws"
)

// Errors of signature verification.
var (
	// ErrBadSignature: the document's signature does not verify, or its
	// header is not acceptable (algorithm, typ, missing kid).
	ErrBadSignature = public.New("manifest", "signature invalid")
	// ErrUntrustedSigner: the document names a key that is not trusted.
	ErrUntrustedSigner = public.New("manifest", "signer not trusted")
)

// algorithmFor returns the one signature algorithm fcd uses with a key of
// this kind; other key kinds are refused. This is the algorithm allow-list:
// EdDSA (Ed25519) and ES256 (P-256).
func algorithmFor(key jwk.Key) (jwa.SignatureAlgorithm, error) {
	switch key.KeyType() {
	case jwa.OKP:
		var raw any
		if err := key.Raw(&raw); err != nil {
			return "", fmt.Errorf("manifest: key: %w", err)
		}
		switch raw.(type) {
		case ed25519.PrivateKey, ed25519.PublicKey:
			return jwa.EdDSA, nil
		}
	case jwa.EC:
		if crv, ok := key.Get(jwk.ECDSACrvKey); ok && crv == jwa.P256 {
			return jwa.ES256, nil
		}
	}
	return "", fmt.Errorf("manifest: key type %s is not allowed (use Ed25519 or P-256)", key.KeyType())
}

// allowedAlgorithm reports whether alg is on the allow-list.
func allowedAlgorithm(alg jwa.SignatureAlgorithm) bool {
	return alg == jwa.EdDSA || alg == jwa.ES256
}

// GenerateKey creates a private signing key of the given algorithm (EdDSA
// or ES256) with its RFC 7638 thumbprint as key id.
func GenerateKey(alg jwa.SignatureAlgorithm) (jwk.Key, error) {
	var raw any
	switch alg {
	case jwa.EdDSA:
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("manifest: generate key: %w", err)
		}
		raw = priv
	case jwa.ES256:
		priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("manifest: generate key: %w", err)
		}
		raw = priv
	default:
		return nil, fmt.Errorf("manifest: algorithm %s is not allowed", alg)
	}
	key, err := jwk.FromRaw(raw)
	if err != nil {
		return nil, fmt.Errorf("manifest: generate key: %w", err)
	}
	if err := jwk.AssignKeyID(key); err != nil {
		return nil, fmt.Errorf("manifest: key id: %w", err)
	}
	if err := key.Set(jwk.AlgorithmKey, alg); err != nil {
		return nil, fmt.Errorf("manifest: key alg: %w", err)
	}
	return key, nil
}

// PublicSet returns a JWK set holding the public halves of keys.
func PublicSet(keys ...jwk.Key) (jwk.Set, error) {
	set := jwk.NewSet()
	for _, k := range keys {
		pub, err := k.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("manifest: public key: %w", err)
		}
		if err := set.AddKey(pub); err != nil {
			return nil, fmt.Errorf("manifest: public key: %w", err)
		}
	}
	return set, nil
}

// LoadPrivateKey reads a private JWK from a file. The key must carry a kid.
func LoadPrivateKey(path string) (jwk.Key, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("manifest: read key: %w", err)
	}
	key, err := jwk.ParseKey(data)
	if err != nil {
		return nil, fmt.Errorf("manifest: parse key %s: %w", path, err)
	}
	if key.KeyID() == "" {
		return nil, fmt.Errorf("manifest: key %s has no kid", path)
	}
	if _, err := algorithmFor(key); err != nil {
		return nil, err
	}
	return key, nil
}

// LoadKeySet reads a JWKS file of trusted public keys.
func LoadKeySet(path string) (jwk.Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("manifest: read key set: %w", err)
	}
	set, err := jwk.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("manifest: parse key set %s: %w", path, err)
	}
	return set, nil
}

// Sign signs payload as a compact JWS with the given typ, using key's kid
// and the algorithm its kind allows.
func Sign(payload []byte, key jwk.Key, typ string) ([]byte, error) {
	alg, err := algorithmFor(key)
	if err != nil {
		return nil, err
	}
	if key.KeyID() == "" {
		return nil, errors.New("manifest: signing key has no kid")
	}
	hdr := jws.NewHeaders()
	for k, v := range map[string]any{jws.TypeKey: typ, jws.KeyIDKey: key.KeyID()} {
		if err := hdr.Set(k, v); err != nil {
			return nil, fmt.Errorf("manifest: header %s: %w", k, err)
		}
	}
	out, err := jws.Sign(payload, jws.WithKey(alg, key, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		return nil, fmt.Errorf("manifest: sign: %w", err)
	}
	return out, nil
}

// notSigned explains a document that is not a JWS at all: an unsigned
// JSON document (the common mistake: posting the file instead of the
// output of its sign command) or something else, in the words of the
// command that signs it, not the JWS parser's.
func notSigned(data []byte, typ string) error {
	noun, cmd := "document", "sign it with its authzd sign command"
	switch typ {
	case TypManifest:
		noun, cmd = "manifest", "sign it with `authzd manifest sign --key KEY FILE`"
	case TypCertificate:
		noun, cmd = "certificate", "sign it with `authzd cert sign --key KEY FILE`"
	case TypResolution:
		noun, cmd = "resolution", "sign it with `authzd lease sign-resolution`"
	}
	if t := bytes.TrimSpace(data); len(t) > 0 && (t[0] == '{' || t[0] == '[') && !bytes.Contains(t, []byte(`"signature"`)) {
		return fmt.Errorf("%w: the %s is not signed: this is plain JSON, and a compact JWS (header.payload.signature) is expected; %s",
			ErrMalformed, noun, cmd)
	}
	return fmt.Errorf("%w: the %s is not a signed document: a compact JWS (header.payload.signature) is expected; %s",
		ErrMalformed, noun, cmd)
}

// Verifier verifies JWS documents against a fixed set of trusted public
// keys. It is safe for concurrent use; it never fetches keys.
type Verifier struct {
	keys map[string]jwk.Key // by kid
}

// NewVerifier returns a verifier trusting the public keys in set. Every key
// needs a kid and an allowed kind; private keys are refused, since a trust
// store holding private keys is a leak waiting to happen.
func NewVerifier(set jwk.Set) (*Verifier, error) {
	v := &Verifier{keys: make(map[string]jwk.Key, set.Len())}
	for i := 0; i < set.Len(); i++ {
		key, _ := set.Key(i)
		if key.KeyID() == "" {
			return nil, fmt.Errorf("manifest: trusted key %d has no kid", i)
		}
		if _, err := algorithmFor(key); err != nil {
			return nil, err
		}
		// jwk.Equal compares RFC 7638 thumbprints, which cover only the
		// public members, so it cannot tell a private key from its public
		// half; ask the key itself.
		if private, err := jwk.IsPrivateKey(key); err != nil {
			return nil, fmt.Errorf("manifest: trusted key %s: %w", key.KeyID(), err)
		} else if private {
			return nil, fmt.Errorf("manifest: trusted key %s is a private key; give public keys only", key.KeyID())
		}
		if _, dup := v.keys[key.KeyID()]; dup {
			return nil, fmt.Errorf("manifest: trusted kid %s appears twice", key.KeyID())
		}
		v.keys[key.KeyID()] = key
	}
	return v, nil
}

// LoadVerifier reads a JWKS file of trusted public keys and returns a
// verifier trusting them.
func LoadVerifier(path string) (*Verifier, error) {
	set, err := LoadKeySet(path)
	if err != nil {
		return nil, err
	}
	v, err := NewVerifier(set)
	if err != nil {
		return nil, fmt.Errorf("manifest: key set %s: %w", path, err)
	}
	return v, nil
}

// Verified is a document whose signature checked out.
type Verified struct {
	Payload []byte
	KeyID   string
}

// Verify checks a JWS (compact or JSON serialization) that must carry
// exactly one signature, typ equal to typ, an allowed algorithm matching
// the trusted key's kind, and a kid naming a trusted key.
func (v *Verifier) Verify(data []byte, typ string) (*Verified, error) {
	data = bytes.TrimSpace(data)
	msg, err := jws.Parse(data)
	if err != nil {
		return nil, notSigned(data, typ)
	}
	sigs := msg.Signatures()
	if len(sigs) != 1 {
		return nil, fmt.Errorf("%w: want exactly one signature, got %d", ErrBadSignature, len(sigs))
	}
	hdr := sigs[0].ProtectedHeaders()
	if hdr.Type() != typ {
		return nil, fmt.Errorf("%w: typ %q, want %q", ErrBadSignature, hdr.Type(), typ)
	}
	alg := hdr.Algorithm()
	if !allowedAlgorithm(alg) {
		return nil, fmt.Errorf("%w: algorithm %q is not allowed", ErrBadSignature, alg)
	}
	kid := hdr.KeyID()
	if kid == "" {
		return nil, fmt.Errorf("%w: no kid in the protected header", ErrBadSignature)
	}
	key, ok := v.keys[kid]
	if !ok {
		return nil, fmt.Errorf("%w: kid %q", ErrUntrustedSigner, kid)
	}
	if want, _ := algorithmFor(key); want != alg {
		return nil, fmt.Errorf("%w: algorithm %s does not fit key %s", ErrBadSignature, alg, kid)
	}
	payload, err := jws.Verify(data, jws.WithKey(alg, key))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	return &Verified{Payload: payload, KeyID: kid}, nil
}

// Signed is a verified, decoded and structurally valid manifest.
type Signed struct {
	Manifest *Manifest
	// Epoch is the manifest's epoch id.
	Epoch string
	// KeyID names the registrar key that signed it.
	KeyID string
	// JWS is the document as received, kept for audit.
	JWS string
}

// VerifyManifest verifies a signed manifest and decodes it strictly.
func (v *Verifier) VerifyManifest(data []byte) (*Signed, error) {
	ver, err := v.Verify(data, TypManifest)
	if err != nil {
		return nil, err
	}
	m, err := Decode(ver.Payload)
	if err != nil {
		return nil, err
	}
	epoch, err := m.EpochID()
	if err != nil {
		return nil, err
	}
	return &Signed{Manifest: m, Epoch: epoch, KeyID: ver.KeyID, JWS: string(bytes.TrimSpace(data))}, nil
}
