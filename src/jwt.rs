//! A bearer JWT's claim as the client identity (`client_id: { jwt: … }`). An OAuth access
//! token is renewed every few hours, and each SDK instance fetches its own, so its hash
//! splits one tenant's keys; a claim of it (`sub`, a tenant id) stays the same across
//! renewals. The proxy answers replays without the upstream, so it checks the token itself
//! — signature (HS256, RS256, ES256 against a JWKS), expiry, and issuer and audience when
//! configured — before believing any claim: a forged token must not reach another
//! tenant's stored answers.

use std::fmt;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::{hmac, signature};
use serde_json::Value;

/// The longest token read (a JWT of a few claims is under 2 KiB; a JWKS-signed one with a
/// 4096-bit RSA signature under 4).
const MAX_TOKEN: usize = 16 * 1024;

/// What a token's signature is checked with.
#[derive(Clone, PartialEq, Eq)]
enum Material {
    /// `kty: oct` — HS256's shared secret.
    Hmac(Vec<u8>),
    /// `kty: RSA` — RS256's modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// `kty: EC`, `crv: P-256` — ES256's point, uncompressed.
    P256(Vec<u8>),
}

#[derive(Clone, PartialEq, Eq)]
struct Key {
    kid: Option<String>,
    material: Material,
}

impl Material {
    fn alg(&self) -> &'static str {
        match self {
            Material::Hmac(_) => "HS256",
            Material::Rsa { .. } => "RS256",
            Material::P256(_) => "ES256",
        }
    }
}

/// The keys and checks of `client_id.jwt`.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    keys: Vec<Key>,
    claim: String,
    issuer: Option<String>,
    audience: Option<String>,
    leeway: Duration,
}

impl fmt::Debug for Verifier {
    /// Names the keys, never their material (an HS256 key is a secret).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.describe_keys())
            .field("claim", &self.claim)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway", &self.leeway)
            .finish()
    }
}

impl Verifier {
    /// Reads a JWKS (`{"keys": [...]}`); keys of other types or uses are refused, so that a
    /// key the proxy would silently skip is not mistaken for one it checks with.
    pub fn from_jwks(
        jwks: &str,
        claim: String,
        issuer: Option<String>,
        audience: Option<String>,
        leeway: Duration,
    ) -> Result<Self, String> {
        let doc: Value =
            serde_json::from_str(jwks).map_err(|e| format!("the JWKS is not JSON: {e}"))?;
        let Some(list) = doc["keys"].as_array().filter(|k| !k.is_empty()) else {
            return Err("the JWKS has no `keys` (expected {\"keys\": [{\"kty\": …}]})".into());
        };
        let keys = list
            .iter()
            .enumerate()
            .map(|(i, k)| jwk(k).map_err(|e| format!("keys[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Verifier {
            keys,
            claim,
            issuer,
            audience,
            leeway,
        })
    }

    /// `kid (alg)` of each key, for `check-config` and logs.
    pub fn describe_keys(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| format!("{} ({})", k.kid.as_deref().unwrap_or("-"), k.material.alg()))
            .collect()
    }

    pub fn claim(&self) -> &str {
        &self.claim
    }

    pub fn issuer(&self) -> Option<&str> {
        self.issuer.as_deref()
    }

    pub fn audience(&self) -> Option<&str> {
        self.audience.as_deref()
    }

    pub fn leeway(&self) -> Duration {
        self.leeway
    }

    /// The identity `token` carries in the configured claim, once every check passes; the
    /// reason otherwise (for the client's `401`: never the token itself).
    pub fn identity(&self, token: &str, now_unix: u64) -> Result<String, String> {
        if token.len() > MAX_TOKEN {
            return Err(format!("the bearer token is over {MAX_TOKEN} bytes"));
        }
        let mut parts = token.split('.');
        let (Some(head), Some(body), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("the bearer token is not a JWT (three base64url parts)".into());
        };
        let header = json_part(head, "header")?;
        if header.get("crit").is_some() {
            return Err(
                "the JWT's header lists `crit` extensions, which are not understood here".into(),
            );
        }
        let alg = header["alg"].as_str().unwrap_or_default();
        let kid = header["kid"].as_str();
        let signature = URL_SAFE_NO_PAD
            .decode(sig)
            .map_err(|_| "the JWT's signature is not base64url".to_owned())?;
        let signed = &token.as_bytes()[..head.len() + 1 + body.len()];
        let candidates: Vec<&Key> = self
            .keys
            .iter()
            .filter(|k| k.material.alg() == alg)
            .filter(|k| kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid)
            .collect();
        if candidates.is_empty() {
            return Err(format!(
                "no key of client_id.jwt verifies `{}` tokens{}",
                printable(alg),
                kid.map(|k| format!(" with kid `{}`", printable(k)))
                    .unwrap_or_default()
            ));
        }
        if !candidates
            .iter()
            .any(|k| verifies(&k.material, signed, &signature))
        {
            return Err("the JWT's signature does not verify with client_id.jwt's keys".into());
        }
        let claims = json_part(body, "claims")?;
        self.check_time(&claims, now_unix)?;
        if let Some(issuer) = &self.issuer
            && claims["iss"].as_str() != Some(issuer)
        {
            return Err(format!("the JWT's issuer is not `{issuer}`"));
        }
        if let Some(audience) = &self.audience {
            let ok = match &claims["aud"] {
                Value::String(a) => a == audience,
                Value::Array(list) => list.iter().any(|a| a.as_str() == Some(audience)),
                _ => false,
            };
            if !ok {
                return Err(format!("the JWT is not for the audience `{audience}`"));
            }
        }
        let id = match &claims[self.claim.as_str()] {
            Value::String(s) => s.clone(),
            Value::Number(n) if n.is_u64() || n.is_i64() => n.to_string(),
            _ => {
                return Err(format!(
                    "the JWT has no `{}` claim of text or a whole number",
                    self.claim
                ));
            }
        };
        if id.is_empty()
            || id.len() > crate::key::MAX_CLIENT_ID_LEN
            || !crate::key::is_visible_ascii(&id)
        {
            return Err(format!(
                "the JWT's `{}` claim must be 1 to {} printable ASCII characters",
                self.claim,
                crate::key::MAX_CLIENT_ID_LEN
            ));
        }
        Ok(id)
    }

    /// `exp` required and not past, `nbf` not ahead — each within the leeway.
    fn check_time(&self, claims: &Value, now: u64) -> Result<(), String> {
        let leeway = self.leeway.as_secs();
        let Some(exp) = claims["exp"].as_f64() else {
            return Err("the JWT has no `exp`: a token that never expires is not accepted".into());
        };
        if (now as f64) > exp + leeway as f64 {
            return Err("the JWT has expired".into());
        }
        if let Some(nbf) = claims["nbf"].as_f64()
            && ((now + leeway) as f64) < nbf
        {
            return Err("the JWT is not valid yet (`nbf`)".into());
        }
        Ok(())
    }
}

fn json_part(part: &str, what: &str) -> Result<Value, String> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| format!("the JWT's {what} is not base64url"))?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => Err(format!("the JWT's {what} is not a JSON object")),
    }
}

fn verifies(material: &Material, signed: &[u8], sig: &[u8]) -> bool {
    match material {
        Material::Hmac(secret) => {
            hmac::verify(&hmac::Key::new(hmac::HMAC_SHA256, secret), signed, sig).is_ok()
        }
        Material::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, signed, sig)
            .is_ok(),
        Material::P256(point) => {
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(signed, sig)
                .is_ok()
        }
    }
}

/// One JWK: its type, and `alg`/`use` when given, must be one the proxy checks with.
fn jwk(k: &Value) -> Result<Key, String> {
    let field = |name: &str| -> Result<Vec<u8>, String> {
        let text = k[name]
            .as_str()
            .ok_or_else(|| format!("`{name}` is missing"))?;
        URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| format!("`{name}` is not base64url"))
    };
    if let Some(usage) = k["use"].as_str()
        && usage != "sig"
    {
        return Err(format!(
            "`use: {usage}`: only signing keys (`sig`) belong here"
        ));
    }
    let material = match (k["kty"].as_str(), k["crv"].as_str()) {
        (Some("oct"), _) => {
            let secret = field("k")?;
            if secret.len() < 32 {
                return Err("an HS256 secret (`k`) must be at least 32 bytes".into());
            }
            Material::Hmac(secret)
        }
        (Some("RSA"), _) => {
            let n = field("n")?;
            if n.len() < 256 {
                return Err("an RSA key under 2048 bits is not accepted".into());
            }
            Material::Rsa { n, e: field("e")? }
        }
        (Some("EC"), Some("P-256")) => {
            let (x, y) = (field("x")?, field("y")?);
            if x.len() != 32 || y.len() != 32 {
                return Err("a P-256 key's `x` and `y` are 32 bytes each".into());
            }
            let mut point = vec![0x04];
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            Material::P256(point)
        }
        (Some(kty), crv) => {
            return Err(format!(
                "`kty: {kty}`{}: use HS256 (`oct`), RS256 (`RSA`) or ES256 (`EC`, `P-256`) keys",
                crv.map(|c| format!(", `crv: {c}`")).unwrap_or_default()
            ));
        }
        (None, _) => return Err("`kty` is missing".into()),
    };
    if let Some(alg) = k["alg"].as_str()
        && alg != material.alg()
    {
        return Err(format!(
            "`alg: {alg}` on a key that verifies {}",
            material.alg()
        ));
    }
    Ok(Key {
        kid: k["kid"].as_str().map(str::to_owned),
        material,
    })
}

/// A header value shown back in an error: printable, short.
fn printable(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(40)
        .collect()
}

#[cfg(test)]
#[path = "jwt_tests.rs"]
mod tests;
