//! `auth:` on a server binding: bearer tokens verified at the gateway, the protected-resource
//! metadata clients discover the authorization server from (RFC 9728), per-item rules and
//! per-caller rate limits.
//!
//! Flow: [`Gate::check`] runs for every request to the MCP path before it is served, on the
//! worker that serves it, and gives the caller's [`Identity`] or a [`Refusal`] that
//! [`refuse`] renders (401/403 with a `WWW-Authenticate: Bearer` challenge, or 503 while no
//! key set is loaded). Verifying a JWT costs a signature check, so each worker remembers
//! the tokens it verified (bounded) until they expire or the key set changes; a session's
//! later requests cost one map lookup. What the caller may use is worked out once, at
//! verification, as one bit per rule ([`rules`]), and how it is counted against the rate
//! limits as one key per limit ([`limits`]).
//!
//! The process-wide half is the [`Guard`]: the config, the key set (swapped whole when a read
//! brings new keys) and the signals between the workers and the key reader ([`keys`]),
//! which runs on worker 0.

pub mod keys;
pub mod limits;
pub mod rules;

use super::net::Request;
use super::sink::Sink;
use crate::FastMap;
use crate::binding::server::metrics as server_metrics;
use crate::config::{JwksSource, ServerAuth};
use crate::jsonrpc;
use crate::jwks::{Family, KeySet};
use arc_swap::ArcSwapOption;
use bytes::BytesMut;
use jsonwebtoken::{Algorithm, Validation};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

/// Longest bearer token taken: a JWT with a generous set of claims is 1 to 2 KiB.
pub const AUTH_TOKEN_BYTES_MAX: usize = 8 * 1024;
/// Tokens each worker remembers as verified.
pub const VERIFIED_TOKENS_PER_WORKER_MAX: usize = 1024;
/// Least time between two reads of the key set asked for by unknown `kid`s: a stream of
/// tokens naming keys that do not exist must not turn into a stream of fetches.
pub const JWKS_REFETCH_INTERVAL_MIN: Duration = Duration::from_secs(10);
/// How long a request whose token names an unknown `kid` waits for the key set to be read
/// again.
pub const JWKS_UNKNOWN_KID_WAIT: Duration = Duration::from_secs(2);

/// JSON-RPC code of a request refused by a rate limit (implementation-defined range).
pub const RATE_LIMITED: i32 = -32000;

/// Refused tokens each worker remembers (by a hash of their bytes), so that replaying one
/// costs a lookup, not a signature check.
pub const REFUSED_TOKENS_PER_WORKER_MAX: usize = 256;
/// How long a refusal is remembered (an expired token's, for good reason, forever would
/// do; the bound keeps the table turning over).
pub const REFUSED_TOKEN_MEMORY: Duration = Duration::from_secs(60);

/// Most keys one token is tried against (a token without `kid`, a set with several keys
/// of its family).
pub const KEYS_TRIED_MAX: usize = 4;

/// Where the metadata lives: this, then the resource's path (RFC 9728 §3.1).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Why a token was refused, in mcpyard's own words (nothing of the token is echoed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    Expired,
    NotYetValid,
    Signature,
    UnknownKey,
    Issuer,
    Audience,
    Algorithm,
    Malformed,
    TooLong,
    NoSubject,
}

impl Invalid {
    /// The `error_description` of the challenge.
    pub fn describe(self) -> &'static str {
        match self {
            Invalid::Expired => "token expired",
            Invalid::NotYetValid => "token not yet valid",
            Invalid::Signature => "signature invalid",
            Invalid::UnknownKey => "unknown key",
            Invalid::Issuer => "wrong issuer",
            Invalid::Audience => "wrong audience",
            Invalid::Algorithm => "algorithm not allowed",
            Invalid::Malformed => "malformed token",
            Invalid::TooLong => "token too long",
            Invalid::NoSubject => "token without subject",
        }
    }
}

/// Why a request was not let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer`.
    Missing,
    /// A token that fails a check.
    Invalid(Invalid),
    /// A valid token without every scope `auth.scopes` needs.
    Scope,
    /// No key set has been loaded yet.
    Keys,
}

/// Labels of `mcpyard_auth_rejected_total`, indexed by [`Refusal::label_index`].
pub const REJECTION_LABELS: [&str; 6] =
    ["missing", "invalid", "expired", "scope", "subject", "keys"];
/// Index of the `subject` label (a request on another subject's session).
pub const REJECTED_SUBJECT: usize = 4;

impl Refusal {
    /// Its index in `server_metrics::REJECTION_LABELS`.
    fn label_index(self) -> usize {
        match self {
            Refusal::Missing => 0,
            Refusal::Invalid(Invalid::Expired) => 2,
            Refusal::Invalid(_) => 1,
            Refusal::Scope => 3,
            Refusal::Keys => 5,
        }
    }
}

/// A verified caller, as one worker remembers it.
#[derive(Debug)]
pub struct Identity {
    /// The `sub` claim ("" when the token has none).
    pub subject: Rc<str>,
    /// The token holds every scope of `auth.scopes`.
    scoped: bool,
    /// Bit `i`: the caller meets rule `i`'s conditions.
    pub(crate) admits: u64,
    /// Per limit, the key of the caller's bucket.
    pub(crate) limit_keys: Box<[u64]>,
    /// Unix seconds after which the token is refused (`exp` plus the leeway).
    expires: u64,
    /// The key set generation it was verified under.
    generation: u64,
}

/// What every worker shares: the config and the key set.
pub struct Guard {
    pub cfg: ServerAuth,
    /// The MCP path, for the metadata URL when `resource` is not set.
    mcp_path: String,
    /// Agents connect over TLS (the scheme of a derived resource URL).
    tls: bool,
    /// One validation per accepted algorithm.
    validations: Vec<(Algorithm, Validation)>,
    keys: ArcSwapOption<KeySet>,
    /// Bumped whenever the key set's content changes.
    generation: AtomicU64,
    /// Workers ask the reader for a read (an unknown `kid`).
    ask: Notify,
    /// The reader tells waiting workers a read finished.
    read_done: Notify,
    /// Milliseconds since `started` of the last read, to space out asked-for reads.
    last_read_ms: AtomicU64,
    started: Instant,
    /// `auth.scopes` joined with spaces, for challenges.
    scopes: String,
    /// An `https://` key set: the TLS its reads start with (set up, and checked, at start).
    pub jwks_tls: Option<crate::certs::Upstream>,
}

impl Guard {
    /// Builds the guard of a server binding; a key set file is read now.
    pub fn new(cfg: ServerAuth, mcp_path: &str, tls: bool) -> Result<Arc<Guard>, String> {
        let leeway = cfg.jwt.leeway.as_secs();
        let validations = cfg
            .jwt
            .algorithms
            .iter()
            .filter_map(|name| name.parse::<Algorithm>().ok())
            .map(|alg| {
                let mut v = Validation::new(alg);
                v.leeway = leeway;
                v.validate_nbf = true;
                v.set_issuer(&[&cfg.jwt.issuer]);
                v.set_audience(&cfg.jwt.audiences);
                v.set_required_spec_claims(&["exp", "iss", "aud"]);
                (alg, v)
            })
            .collect();
        let (keys, jwks_tls) = match &cfg.jwt.jwks {
            JwksSource::File(path) => {
                let bytes = crate::jwks::read_file(path)?;
                let set = crate::jwks::parse(&bytes).and_then(crate::jwks::require_keys)?;
                (Some(Arc::new(set)), None)
            }
            JwksSource::Url(url) => {
                let tls = crate::certs::Upstream::new(&url.host, cfg.jwt.jwks_ca.as_deref())
                    .map_err(|e| format!("jwt.jwks: {e}"))?;
                (None, Some(tls))
            }
        };
        let scopes = cfg.scopes.join(" ");
        Ok(Arc::new(Guard {
            cfg,
            mcp_path: mcp_path.to_owned(),
            tls,
            validations,
            keys: ArcSwapOption::new(keys),
            generation: AtomicU64::new(0),
            ask: Notify::new(),
            read_done: Notify::new(),
            last_read_ms: AtomicU64::new(0),
            started: Instant::now(),
            scopes,
            jwks_tls,
        }))
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Takes a freshly read key set; true when its content differs from the one in use.
    pub fn install(&self, set: KeySet) -> bool {
        let same = self
            .keys
            .load()
            .as_ref()
            .is_some_and(|old| old.digest == set.digest);
        if same {
            return false;
        }
        self.keys.store(Some(Arc::new(set)));
        self.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// A read finished (whatever it brought): waiting workers look again.
    pub fn read_finished(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_read_ms.store(ms.max(1), Ordering::Release);
        self.read_done.notify_waiters();
    }

    /// Whether a read asked for now would be done at once (not held back by
    /// [`JWKS_REFETCH_INTERVAL_MIN`]).
    fn reread_allowed(&self) -> bool {
        let last = self.last_read_ms.load(Ordering::Acquire);
        last == 0
            || self.started.elapsed().as_millis() as u64
                >= last + JWKS_REFETCH_INTERVAL_MIN.as_millis() as u64
    }

    /// When the reader may honour an ask: [`JWKS_REFETCH_INTERVAL_MIN`] after the last read.
    pub fn next_asked_read(&self) -> Instant {
        let last = self.last_read_ms.load(Ordering::Acquire);
        self.started + Duration::from_millis(last) + JWKS_REFETCH_INTERVAL_MIN
    }

    /// Waits for a worker to ask for a read.
    pub async fn asked(&self) {
        self.ask.notified().await;
    }

    /// Whether a key set is loaded.
    /// Drops the key set in use (reads have failed too long): tokens are answered 503
    /// until one is installed again.
    pub fn withdraw(&self) {
        self.keys.store(None);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn has_keys(&self) -> bool {
        self.keys.load().is_some()
    }

    /// The protected resource's URL: `resource`, or the scheme, `host` and the MCP path.
    pub fn resource(&self, host: &str) -> String {
        match &self.cfg.resource {
            Some(resource) => resource.clone(),
            None => format!("{}://{host}{}", self.scheme(), self.mcp_path),
        }
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// The metadata URL challenges name: the resource's origin, [`METADATA_PATH`], then
    /// the resource's path (left out when it is `/`).
    pub fn metadata_url(&self, host: &str) -> String {
        let resource = self.resource(host);
        let after_scheme = resource.find("://").map_or(0, |at| at + 3);
        let path_at = resource
            .get(after_scheme..)
            .and_then(|rest| rest.find(['/', '?']))
            .map_or(resource.len(), |at| after_scheme + at);
        let (origin, path) = resource.split_at(path_at);
        let path = path.split('?').next().unwrap_or_default();
        let path = if path == "/" { "" } else { path };
        format!("{origin}{METADATA_PATH}{path}")
    }

    /// Whether `path` is one of the metadata paths this binding answers.
    pub fn is_metadata_path(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix(METADATA_PATH) else {
            return false;
        };
        if rest.is_empty() || rest == self.mcp_path {
            return true;
        }
        // The configured resource's own path, when it differs from the MCP path (a
        // gateway behind a proxy that maps paths).
        let configured = self.cfg.resource.as_ref().map(|_| self.metadata_url(""));
        configured.is_some_and(|url| url.ends_with(path))
    }

    /// The metadata document (RFC 9728 §2).
    pub fn metadata(&self, host: &str) -> Vec<u8> {
        let mut out = String::with_capacity(256);
        out.push_str("{\"resource\":\"");
        out.push_str(&self.resource(host));
        out.push_str("\",\"authorization_servers\":");
        push_strings(
            &mut out,
            self.cfg.authorization_servers.iter().map(String::as_str),
        );
        out.push_str(",\"scopes_supported\":");
        push_strings(&mut out, self.cfg.scopes_supported().into_iter());
        out.push_str(",\"bearer_methods_supported\":[\"header\"]}");
        out.into_bytes()
    }

    /// Verifies `token` at `now` (Unix seconds) against the key set in use.
    fn verify(&self, token: &str, now: u64, gate: &Gate) -> Result<Identity, Verify> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|_| Verify::Invalid(Invalid::Malformed))?;
        let Some((_, validation)) = self.validations.iter().find(|(a, _)| *a == header.alg) else {
            return Err(Verify::Invalid(Invalid::Algorithm));
        };
        if Family::of(header.alg).is_none() {
            return Err(Verify::Invalid(Invalid::Algorithm));
        }
        let generation = self.generation();
        let Some(keys) = self.keys.load_full() else {
            return Err(Verify::Keys);
        };
        let kid = header.kid.as_deref();
        if kid.is_some() && keys.candidates(kid, header.alg).next().is_none() {
            return Err(Verify::UnknownKid);
        }
        let mut outcome = Err(Verify::Invalid(Invalid::UnknownKey));
        // A signature check per key tried: a token that names no key is tried against a
        // few of its family, not all of them.
        for key in keys.candidates(kid, header.alg).take(KEYS_TRIED_MAX) {
            server_metrics::with(|m| m.auth_signature_checks += 1);
            match jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
                token, &key.key, validation,
            ) {
                Ok(data) => return gate.identity(&data.claims, now, generation),
                Err(e) => {
                    outcome = Err(Verify::Invalid(invalid_of(e.kind())));
                    // Without a kid, the next key of the family may be the one.
                    if !matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) {
                        break;
                    }
                }
            }
        }
        outcome
    }
}

/// Appends `["a","b"]`; the strings were checked by the config loader (no `"` or `\`).
fn push_strings<'a>(out: &mut String, items: impl Iterator<Item = &'a str>) {
    out.push('[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        out.push_str(item);
        out.push('"');
    }
    out.push(']');
}

/// What verification gave besides an identity.
#[derive(Debug)]
enum Verify {
    Invalid(Invalid),
    /// The token names a key the set does not have (yet).
    UnknownKid,
    /// No key set loaded.
    Keys,
}

fn invalid_of(kind: &jsonwebtoken::errors::ErrorKind) -> Invalid {
    use jsonwebtoken::errors::ErrorKind as K;
    match kind {
        K::ExpiredSignature => Invalid::Expired,
        K::ImmatureSignature => Invalid::NotYetValid,
        K::InvalidSignature | K::InvalidEcdsaKey | K::InvalidRsaKey(_) => Invalid::Signature,
        K::InvalidIssuer => Invalid::Issuer,
        K::InvalidAudience => Invalid::Audience,
        K::MissingRequiredClaim(claim) if claim == "aud" => Invalid::Audience,
        K::MissingRequiredClaim(claim) if claim == "iss" => Invalid::Issuer,
        K::InvalidAlgorithm | K::MissingAlgorithm | K::InvalidAlgorithmName => Invalid::Algorithm,
        _ => Invalid::Malformed,
    }
}

/// One worker's side of a server binding's `auth`: the tokens it verified and its rate
/// buckets.
pub struct Gate {
    pub guard: Arc<Guard>,
    /// Verified tokens, by their bytes. Invariant: `len() <= VERIFIED_TOKENS_PER_WORKER_MAX`.
    memory: RefCell<FastMap<Box<[u8]>, Rc<Identity>>>,
    pub(crate) buckets: RefCell<limits::Buckets>,
    /// Refused tokens, by the hash of their bytes: why, under which key set generation,
    /// until when. Invariant: `len() <= REFUSED_TOKENS_PER_WORKER_MAX`.
    refusals: RefCell<FastMap<u64, (Invalid, u64, Instant)>>,
    hasher: foldhash::fast::RandomState,
}

impl Gate {
    pub fn new(guard: Arc<Guard>) -> Gate {
        Gate {
            guard,
            memory: RefCell::new(FastMap::default()),
            buckets: RefCell::new(limits::Buckets::default()),
            refusals: RefCell::new(FastMap::default()),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The caller of `req`, or why it is refused.
    pub async fn check(&self, req: &Request) -> Result<Rc<Identity>, Refusal> {
        let refused = |r: Refusal| {
            server_metrics::count_rejected(r.label_index());
            Err(r)
        };
        let raw = match bearer_token(req.head.headers.get("authorization")) {
            Ok(raw) => raw,
            Err(r) => return refused(r),
        };
        let now = unix_now();
        let generation = self.guard.generation();
        // A token remembered byte for byte was checked whole when it was verified: the
        // common case costs one hash and one compare, not a scan of the token.
        let remembered = self.memory.borrow().get(raw).cloned();
        if let Some(identity) = remembered
            && identity.generation == generation
            && now <= identity.expires
        {
            server_metrics::with(|m| m.auth_verified_cached += 1);
            return if identity.scoped {
                Ok(identity)
            } else {
                refused(Refusal::Scope)
            };
        }
        let token = match jwt_text(raw) {
            Ok(token) => token,
            Err(r) => return refused(r),
        };
        use std::hash::BuildHasher;
        let key = self.hasher.hash_one(raw);
        if let Some(why) = self.refused_before(key, generation) {
            return refused(Refusal::Invalid(why));
        }
        let mut verified = self.guard.verify(token, now, self);
        if matches!(verified, Err(Verify::UnknownKid)) {
            // Whether this ask brought the read or another one finished meanwhile, a set
            // that changed since the first try is tried again.
            self.reread().await;
            if self.guard.generation() != generation {
                verified = self.guard.verify(token, unix_now(), self);
            }
        }
        let identity = match verified {
            Ok(identity) => Rc::new(identity),
            Err(Verify::Invalid(why)) => {
                self.remember_refusal(key, why, generation);
                return refused(Refusal::Invalid(why));
            }
            // Not remembered: it cost no signature check, and a key published late must
            // still be found when the same token comes back.
            Err(Verify::UnknownKid) => return refused(Refusal::Invalid(Invalid::UnknownKey)),
            Err(Verify::Keys) => return refused(Refusal::Keys),
        };
        server_metrics::with(|m| m.auth_verified += 1);
        self.remember(token, identity.clone(), now);
        if identity.scoped {
            Ok(identity)
        } else {
            refused(Refusal::Scope)
        }
    }

    /// Why the token hashed to `key` was refused before, if that still holds: the same key
    /// set (an expired token stays expired whatever the keys), within the memory's time.
    fn refused_before(&self, key: u64, generation: u64) -> Option<Invalid> {
        let refusals = self.refusals.borrow();
        let (why, under, until) = refusals.get(&key)?;
        let holds = (*under == generation || *why == Invalid::Expired) && Instant::now() < *until;
        holds.then_some(*why)
    }

    /// Remembers a refusal that a replay would meet again. A token not yet valid will be,
    /// so it is not remembered.
    fn remember_refusal(&self, key: u64, why: Invalid, generation: u64) {
        if why == Invalid::NotYetValid {
            return;
        }
        let now = Instant::now();
        let mut refusals = self.refusals.borrow_mut();
        if refusals.len() >= REFUSED_TOKENS_PER_WORKER_MAX {
            refusals.retain(|_, (_, _, until)| now < *until);
        }
        if refusals.len() >= REFUSED_TOKENS_PER_WORKER_MAX {
            let oldest = refusals
                .iter()
                .min_by_key(|(_, (_, _, until))| *until)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                refusals.remove(&oldest);
            }
        }
        refusals.insert(key, (why, generation, now + REFUSED_TOKEN_MEMORY));
        assert!(refusals.len() <= REFUSED_TOKENS_PER_WORKER_MAX);
    }

    /// Counts a request (`method`, and the tool it calls) against the limits that apply to
    /// it; a refusal gives the limit's name and the seconds to wait.
    pub fn limit(
        &self,
        who: &Identity,
        method: &str,
        target: Option<&str>,
    ) -> Result<(), (&str, u64)> {
        let limits = &self.guard.cfg.limits;
        if limits.is_empty() {
            return Ok(());
        }
        let applies = |limit: &crate::config::Limit| match &limit.tools {
            None => true,
            Some(tools) => method == "tools/call" && target.is_some_and(|t| tools.admits(t)),
        };
        let taken =
            self.buckets
                .borrow_mut()
                .take(limits, &who.limit_keys, applies, Instant::now());
        taken.map_err(|refused| {
            let name = limits.get(refused.limit).map_or("", |l| l.name.as_str());
            server_metrics::with(|m| server_metrics::count_limited(&mut m.rate_limited, name, 1));
            (name, limits::retry_after_secs(refused.retry_after))
        })
    }

    /// Keeps a verified token; a full table first loses its expired entries, then, if
    /// still full, the one that expires soonest (counted).
    fn remember(&self, token: &str, identity: Rc<Identity>, now: u64) {
        let mut memory = self.memory.borrow_mut();
        if memory.len() >= VERIFIED_TOKENS_PER_WORKER_MAX {
            memory.retain(|_, id| now <= id.expires);
        }
        if memory.len() >= VERIFIED_TOKENS_PER_WORKER_MAX {
            let soonest = memory
                .iter()
                .min_by_key(|(_, id)| id.expires)
                .map(|(token, _)| token.clone());
            if let Some(soonest) = soonest {
                memory.remove(&soonest);
                server_metrics::with(|m| m.auth_tokens_evicted += 1);
            }
        }
        memory.insert(Box::from(token.as_bytes()), identity);
        assert!(memory.len() <= VERIFIED_TOKENS_PER_WORKER_MAX);
    }

    /// Asks the key reader for a read and waits for it (bounded); returns at once when no
    /// read may happen now.
    async fn reread(&self) {
        let done = self.guard.read_done.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        if !self.guard.reread_allowed() {
            return;
        }
        self.guard.ask.notify_one();
        let _ = tokio::time::timeout(JWKS_UNKNOWN_KID_WAIT, done).await;
    }

    /// The identity of verified `claims`.
    fn identity(
        &self,
        claims: &serde_json::Map<String, serde_json::Value>,
        now: u64,
        generation: u64,
    ) -> Result<Identity, Verify> {
        let cfg = &self.guard.cfg;
        // Sessions belong to their subject: a token that names none cannot own one.
        let subject = claims
            .get("sub")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .ok_or(Verify::Invalid(Invalid::NoSubject))?;
        let subject: Rc<str> = Rc::from(subject);
        let scopes = claim_strings(claims.get("scope").or_else(|| claims.get("scp")), ' ');
        let groups = claim_strings(claims.get(cfg.jwt.groups_claim.as_str()), '\0');
        let has_scope = |s: &String| scopes.iter().any(|t| t == s);
        let scoped = cfg.scopes.iter().all(has_scope);
        let admits = rules::admitted(&cfg.rules, &subject, &scopes, &groups);
        let limit_keys = cfg
            .limits
            .iter()
            .map(|limit| {
                use std::hash::BuildHasher;
                let value = claims.get(limit.per.as_str());
                let text = match value {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                self.hasher.hash_one(text.as_str())
            })
            .collect();
        // `exp` is required and was checked; a fractional one counts to its whole second.
        let exp = claims
            .get("exp")
            .and_then(|v| v.as_f64())
            .map_or(now, |e| e.clamp(0.0, u64::MAX as f64) as u64);
        Ok(Identity {
            subject,
            scoped,
            admits,
            limit_keys,
            expires: exp.saturating_add(cfg.jwt.leeway.as_secs()),
            generation,
        })
    }
}

/// The strings of a claim that is a string (split on `split`) or an array of strings.
fn claim_strings(value: Option<&serde_json::Value>, split: char) -> Vec<String> {
    match value {
        Some(serde_json::Value::String(s)) => s
            .split(split)
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// The token of an `Authorization: Bearer <token>` value, as bytes (bounded in length;
/// [`jwt_text`] checks the rest).
fn bearer_token(value: Option<&[u8]>) -> Result<&[u8], Refusal> {
    let value = value.ok_or(Refusal::Missing)?;
    let scheme_end = value.iter().position(|b| *b == b' ').unwrap_or(value.len());
    let (scheme, rest) = value.split_at(scheme_end);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(Refusal::Missing);
    }
    let token = rest.trim_ascii();
    if token.is_empty() {
        return Err(Refusal::Missing);
    }
    if token.len() > AUTH_TOKEN_BYTES_MAX {
        return Err(Refusal::Invalid(Invalid::TooLong));
    }
    Ok(token)
}

/// A token's bytes as text, when they can be a JWT: base64url parts joined by dots.
fn jwt_text(token: &[u8]) -> Result<&str, Refusal> {
    let jwt_byte = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'=');
    if !token.iter().all(jwt_byte) {
        return Err(Refusal::Invalid(Invalid::Malformed));
    }
    std::str::from_utf8(token).map_err(|_| Refusal::Invalid(Invalid::Malformed))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The request's host (see [`crate::http::RequestHead::host`]), when it is one a URL may
/// carry: 1 to 255 bytes of letters, digits, `.`, `-`, `_`, `:`, `[` and `]`.
pub fn url_host(req: &Request) -> Option<&str> {
    host_for_url(req.head.host()?)
}

/// Longest `Host` written into a metadata URL.
const URL_HOST_BYTES_MAX: usize = 255;

/// `host` when it may go into a URL, a JSON string and a quoted header parameter as it is.
fn host_for_url(host: &[u8]) -> Option<&str> {
    let ok = !host.is_empty()
        && host.len() <= URL_HOST_BYTES_MAX
        && host.iter().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'[' | b']')
        });
    if ok {
        std::str::from_utf8(host).ok()
    } else {
        None
    }
}

/// Answers a refused request: 401/403 with the challenge, or 503 while no keys are loaded.
pub async fn refuse(guard: &Guard, req: &Request, sink: Sink, refusal: Refusal) {
    let Some(host) = url_host(req).or(guard.cfg.resource.as_ref().map(|_| "")) else {
        return bad_host(sink).await;
    };
    server_metrics::with(|m| m.http_errors += 1);
    let metadata = guard.metadata_url(host);
    let (status, message, challenge) = match refusal {
        Refusal::Missing => {
            let scope = if guard.scopes.is_empty() {
                String::new()
            } else {
                format!("scope=\"{}\", ", guard.scopes)
            };
            (
                401,
                "Unauthorized: a bearer token is required",
                format!("Bearer {scope}resource_metadata=\"{metadata}\""),
            )
        }
        Refusal::Invalid(why) => (
            401,
            "Unauthorized: invalid token",
            format!(
                "Bearer error=\"invalid_token\", error_description=\"{}\", resource_metadata=\"{metadata}\"",
                why.describe()
            ),
        ),
        Refusal::Scope => (
            403,
            "Forbidden: insufficient scope",
            format!(
                "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{metadata}\"",
                guard.scopes
            ),
        ),
        Refusal::Keys => {
            let mut body = BytesMut::with_capacity(128);
            jsonrpc::write_error(
                None,
                jsonrpc::INTERNAL_ERROR,
                "Service unavailable: the token signing keys are not loaded yet",
                None,
                &mut body,
            );
            let headers: [(&str, &[u8]); 2] =
                [("content-type", b"application/json"), ("retry-after", b"1")];
            let _ = sink.respond(503, &headers, &body).await;
            return;
        }
    };
    let mut body = BytesMut::with_capacity(128);
    jsonrpc::write_error(None, jsonrpc::INVALID_REQUEST, message, None, &mut body);
    let headers: [(&str, &[u8]); 2] = [
        ("content-type", b"application/json"),
        ("www-authenticate", challenge.as_bytes()),
    ];
    let _ = sink.respond(status, &headers, &body).await;
}

/// Answers a request over a rate limit: 429, `Retry-After`, and a JSON-RPC error with the
/// request's id that names the limit and the wait.
pub async fn too_many(sink: Sink, id: &str, limit: &str, retry_after: u64) {
    use std::fmt::Write as _;
    let mut data = String::with_capacity(64);
    // The limit's name is from the config: letters, digits, - and _.
    let _ = write!(
        data,
        "{{\"limit\":\"{limit}\",\"retryAfter\":{retry_after}}}"
    );
    let mut body = BytesMut::with_capacity(128);
    jsonrpc::write_error(
        Some(id),
        RATE_LIMITED,
        "Rate limit exceeded",
        Some(data.as_bytes()),
        &mut body,
    );
    let seconds = retry_after.to_string();
    let headers: [(&str, &[u8]); 2] = [
        ("content-type", b"application/json"),
        ("retry-after", seconds.as_bytes()),
    ];
    let _ = sink.respond(429, &headers, &body).await;
}

/// The answer to a `Host` that cannot go into the resource's URL.
async fn bad_host(sink: Sink) {
    let message = "Bad Request: the Host header cannot name this resource";
    super::edge::http_error(sink, 400, message, None).await;
}

/// Serves `GET` on a metadata path; other methods get 405.
pub async fn serve_metadata(guard: &Guard, req: &Request, sink: Sink) {
    if req.head.method != crate::http::Method::Get {
        server_metrics::with(|m| m.http_errors += 1);
        let mut body = BytesMut::with_capacity(96);
        jsonrpc::write_error(
            None,
            jsonrpc::INTERNAL_ERROR,
            "method not allowed",
            None,
            &mut body,
        );
        let headers: [(&str, &[u8]); 2] =
            [("content-type", b"application/json"), ("allow", b"GET")];
        let _ = sink.respond(405, &headers, &body).await;
        return;
    }
    let Some(host) = url_host(req).or(guard.cfg.resource.as_ref().map(|_| "")) else {
        return bad_host(sink).await;
    };
    let body = guard.metadata(host);
    // Built from the request's Host when `resource` is not set: not for shared caches.
    let headers: [(&str, &[u8]); 2] = [
        ("content-type", b"application/json"),
        ("cache-control", b"no-store"),
    ];
    let _ = sink.respond(200, &headers, &body).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(resource: Option<&str>) -> Arc<Guard> {
        let resource = resource.map_or(String::new(), |r| format!("resource: \"{r}\", "));
        let text = format!(
            "bindings:\n  north:\n    kind: server\n    listen: 127.0.0.1:0\n    exit: d\n    \
             auth: {{ {resource}scopes: [mcp], jwt: {{ issuer: i, audiences: [a], \
             jwks: \"https://keys.example/jwks\" }} }}\n  d: {{ kind: demo }}\n"
        );
        let config = crate::config::load_str(&text, "t.yaml").expect("a valid config");
        let Some(crate::config::Binding::Server(north)) = config.bindings.get("north") else {
            panic!("north is a server");
        };
        let auth = north.auth.as_ref().expect("auth");
        Guard::new((**auth).clone(), "/mcp", false).expect("a guard")
    }

    #[test]
    fn a_key_set_unread_for_long_is_dropped_and_an_emptied_one_is_installed() {
        const SET: &[u8] = br#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"ed"}]}"#;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        let keys = |g: &Guard| g.keys.load().as_ref().map(|set| set.keys.len());
        // Read once, then never again.
        let g = guard(None);
        let reads = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let counted = reads.clone();
        let read = move || {
            counted.set(counted.get() + 1);
            let first = counted.get() == 1;
            async move {
                if first {
                    Ok(bytes::Bytes::from_static(SET))
                } else {
                    Err("unreachable".to_owned())
                }
            }
        };
        runtime.block_on(async {
            let reader = keys::run("north", g.clone(), read);
            let check = async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                assert_eq!(keys(&g), Some(1));
                let stale = keys::JWKS_STALE_AFTER_MIN;
                tokio::time::sleep(stale - Duration::from_secs(120)).await;
                assert_eq!(keys(&g), Some(1), "still within the bound");
                tokio::time::sleep(Duration::from_secs(600)).await;
                assert_eq!(keys(&g), None, "dropped: tokens get 503");
            };
            tokio::select! {
                () = reader => panic!("the reader ended"),
                () = check => {}
            }
        });
        assert!(reads.get() > 10, "{} reads", reads.get());
        // A set whose keys were all withdrawn is installed, empty, not ignored.
        let g = guard(None);
        let mut answers = vec![SET, &br#"{"keys":[]}"#[..]].into_iter();
        let read = move || {
            let bytes = answers.next().unwrap_or(br#"{"keys":[]}"#);
            async move { Ok(bytes::Bytes::from_static(bytes)) }
        };
        runtime.block_on(async {
            let reader = keys::run("north", g.clone(), read);
            let check = async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                assert_eq!(keys(&g), Some(1));
                tokio::time::sleep(g.cfg.jwt.refresh).await;
                assert_eq!(keys(&g), Some(0), "every key withdrawn");
            };
            tokio::select! {
                () = reader => panic!("the reader ended"),
                () = check => {}
            }
        });
    }

    #[test]
    fn hostile_hosts_never_reach_a_url_or_a_header() {
        for bad in [
            &b""[..],
            b"a\"b",
            b"a\\b",
            b"a b",
            b"a\r\nx: y",
            b"a\0",
            b"h/x",
            b"h?x",
            b"h#x",
            "h\u{e9}".as_bytes(),
            &[b'a'; URL_HOST_BYTES_MAX + 1],
        ] {
            assert_eq!(host_for_url(bad), None, "{bad:?}");
        }
        for good in [
            "127.0.0.1:8080",
            "[::1]:7114",
            "mcp.example",
            "gw_1.internal",
        ] {
            assert_eq!(host_for_url(good.as_bytes()), Some(good));
        }
    }

    #[test]
    fn metadata_urls_insert_the_well_known_path_before_the_resource_path() {
        let derived = guard(None);
        assert_eq!(derived.resource("h:1"), "http://h:1/mcp");
        assert_eq!(
            derived.metadata_url("h:1"),
            "http://h:1/.well-known/oauth-protected-resource/mcp"
        );
        assert!(derived.is_metadata_path("/.well-known/oauth-protected-resource"));
        assert!(derived.is_metadata_path("/.well-known/oauth-protected-resource/mcp"));
        assert!(!derived.is_metadata_path("/.well-known/oauth-protected-resource/other"));
        assert!(!derived.is_metadata_path("/.well-known/oauth-protected-resourcex"));
        let configured = guard(Some("https://mcp.example/tenant/mcp?x=1"));
        assert_eq!(
            configured.metadata_url("ignored:1"),
            "https://mcp.example/.well-known/oauth-protected-resource/tenant/mcp"
        );
        assert!(configured.is_metadata_path("/.well-known/oauth-protected-resource/tenant/mcp"));
        assert!(configured.is_metadata_path("/.well-known/oauth-protected-resource/mcp"));
        let root = guard(Some("https://mcp.example/"));
        assert_eq!(
            root.metadata_url(""),
            "https://mcp.example/.well-known/oauth-protected-resource"
        );
        let metadata = String::from_utf8(derived.metadata("h:1")).expect("text");
        let parsed: serde_json::Value = serde_json::from_str(&metadata).expect("JSON");
        assert_eq!(parsed["resource"], "http://h:1/mcp");
        assert_eq!(parsed["authorization_servers"][0], "i");
        assert_eq!(parsed["scopes_supported"][0], "mcp");
    }

    #[test]
    fn bearer_tokens_are_bounded_and_must_look_like_jwts() {
        assert_eq!(bearer_token(None), Err(Refusal::Missing));
        assert_eq!(bearer_token(Some(b"Basic abc")), Err(Refusal::Missing));
        assert_eq!(bearer_token(Some(b"Bearer ")), Err(Refusal::Missing));
        assert_eq!(bearer_token(Some(b"bearer a.b.c")), Ok(&b"a.b.c"[..]));
        let long = [b'a'; AUTH_TOKEN_BYTES_MAX + 1];
        let mut header = b"Bearer ".to_vec();
        header.extend_from_slice(&long);
        assert_eq!(
            bearer_token(Some(&header)),
            Err(Refusal::Invalid(Invalid::TooLong))
        );
        for bad in [&b"a b"[..], b"a\"b", b"a\0b", "\u{e9}".as_bytes()] {
            assert_eq!(
                jwt_text(bad),
                Err(Refusal::Invalid(Invalid::Malformed)),
                "{bad:?}"
            );
        }
        assert_eq!(jwt_text(b"eyJ.eyJ.sig-_="), Ok("eyJ.eyJ.sig-_="));
    }
}
