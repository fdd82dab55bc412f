//! `bindings.<server>.auth`: who may call the gateway, what each caller may use, and how
//! fast. The raw serde shape, its checks and the validated types live together here, so
//! the rest of the config loader only hands the section over (`validate::validate_server`).
//!
//! Every string that later goes into a response head or a JSON body (the issuer, the
//! resource and authorization-server URLs, scope names) is checked here to be visible ASCII
//! without `"` or `\`, so the writers need no escaping and a config can never smuggle a
//! header break.

use std::time::Duration;

use serde_yaml_ng::Value;

use super::duration::format_duration;
use super::model::{JwksSource, Jwt, Limit, Rule, Scheme, ServerAuth};
use super::raw::{RawLimit, RawRule, RawServerAuth, quote, render};
use super::url::parse_upstream_url;

/// Most rules of one server binding: a caller's rights are one bit per rule.
pub const AUTH_RULES_MAX: usize = 64;
/// Most rate limits of one server binding.
pub const AUTH_LIMITS_MAX: usize = 16;
/// Most entries in `scopes`, `audiences`, `authorization_servers`, a rule's `scopes`,
/// `groups` or `subjects`.
pub const AUTH_LIST_MAX: usize = 32;
/// Longest issuer, audience, URL, scope, group or subject in the config.
pub const AUTH_STRING_BYTES_MAX: usize = 512;

/// Longest claim name (`per`, `groups_claim`) and toolkit name in a rule.
const CLAIM_NAME_BYTES_MAX: usize = 64;
/// Longest limit name (a metrics label value).
const LIMIT_NAME_BYTES_MAX: usize = 32;
/// Largest `N` of a rate and largest burst.
const RATE_COUNT_MAX: u32 = 1_000_000;

const JWKS_REFRESH_DEFAULT: Duration = Duration::from_secs(5 * 60);
const JWKS_REFRESH_MIN: Duration = Duration::from_secs(1);
const JWKS_REFRESH_MAX: Duration = Duration::from_secs(24 * 60 * 60);
const LEEWAY_DEFAULT: Duration = Duration::from_secs(30);
const LEEWAY_MAX: Duration = Duration::from_secs(5 * 60);
const GROUPS_CLAIM_DEFAULT: &str = "groups";
const LIMIT_PER_DEFAULT: &str = "sub";

/// The signature algorithms a token may use. No `none`, no HMAC: a shared secret in a
/// gateway config is a key every agent operator would need too.
pub const ALGORITHMS: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];
const ALGORITHMS_DEFAULT: &[&str] = &["RS256", "ES256", "EdDSA"];

/// A check's failure: the key path below `auth` and the message.
type Fault = (String, String);

fn fault(path: impl Into<String>, message: impl Into<String>) -> Fault {
    (path.into(), message.into())
}

/// What a server's `auth` check needs from the rest of the config.
pub(super) struct AuthContext<'a> {
    /// The config file's directory.
    pub dir: &'a std::path::Path,
}

/// Checks `auth:`; faults carry paths relative to `auth`.
pub(super) fn validate(raw: RawServerAuth, cx: &AuthContext<'_>) -> Result<ServerAuth, Fault> {
    let raw_jwt = raw.jwt.ok_or_else(|| {
        fault(
            "jwt",
            "missing, expected a mapping with issuer, jwks and audiences",
        )
    })?;
    let resource = raw
        .resource
        .as_ref()
        .map(|v| url_string("resource", v))
        .transpose()?;
    let issuer = raw_jwt
        .issuer
        .as_ref()
        .map(|v| header_string("jwt.issuer", v))
        .transpose()?
        .ok_or_else(|| fault("jwt.issuer", "missing, expected the token issuer (iss)"))?;
    let audiences = match raw_jwt.audiences {
        Some(list) => strings("jwt.audiences", &list, "an audience", header_string)?,
        None => match &resource {
            Some(resource) => vec![resource.clone()],
            None => {
                return Err(fault(
                    "jwt.audiences",
                    "missing, expected the audiences a token's aud may name (needed when resource is not set)",
                ));
            }
        },
    };
    if audiences.is_empty() {
        return Err(fault(
            "jwt.audiences",
            "found [], expected at least one audience",
        ));
    }
    let jwks = jwks_source(cx, raw_jwt.jwks.as_ref())?;
    let jwks_ca = match raw_jwt.jwks_ca.as_ref() {
        None => None,
        Some(value) => {
            if !matches!(jwks, JwksSource::Url(_)) {
                return Err(fault(
                    "jwt.jwks_ca",
                    "found jwks_ca with a key set file, expected it only with an https:// jwks URL",
                ));
            }
            let path = value
                .as_str()
                .filter(|s| !s.is_empty())
                .map(|s| cx.dir.join(s))
                .ok_or_else(|| {
                    fault(
                        "jwt.jwks_ca",
                        format!(
                            "found {}, expected the path of a PEM CA file",
                            render(value)
                        ),
                    )
                })?;
            crate::certs::client_config(Some(&path)).map_err(|e| fault("jwt.jwks_ca", e))?;
            Some(path)
        }
    };
    let refresh = duration(
        "jwt.refresh",
        raw_jwt.refresh.as_ref(),
        JWKS_REFRESH_DEFAULT,
        JWKS_REFRESH_MIN,
        JWKS_REFRESH_MAX,
    )?;
    let leeway = duration(
        "jwt.leeway",
        raw_jwt.leeway.as_ref(),
        LEEWAY_DEFAULT,
        Duration::ZERO,
        LEEWAY_MAX,
    )?;
    let algorithms = match raw_jwt.algorithms {
        None => ALGORITHMS_DEFAULT.iter().map(|a| (*a).to_owned()).collect(),
        Some(list) => {
            let names = strings("jwt.algorithms", &list, "an algorithm", |path, v| {
                let name = v.as_str().unwrap_or_default();
                if ALGORITHMS.contains(&name) {
                    Ok(name.to_owned())
                } else {
                    Err(fault(
                        path,
                        format!(
                            "found {}, expected one of {}",
                            render(v),
                            ALGORITHMS.join(", ")
                        ),
                    ))
                }
            })?;
            if names.is_empty() {
                return Err(fault("jwt.algorithms", "found [], expected at least one"));
            }
            names
        }
    };
    let groups_claim = raw_jwt
        .groups_claim
        .as_ref()
        .map(|v| claim_name("jwt.groups_claim", v))
        .transpose()?
        .unwrap_or_else(|| GROUPS_CLAIM_DEFAULT.to_owned());
    let authorization_servers = match raw.authorization_servers {
        Some(list) => strings(
            "authorization_servers",
            &list,
            "an authorization server URL",
            url_string,
        )?,
        None => vec![issuer.clone()],
    };
    let scopes = match raw.scopes {
        Some(list) => strings("scopes", &list, "a scope", scope_string)?,
        None => Vec::new(),
    };
    let rules = at_most("rules", raw.rules.unwrap_or_default(), AUTH_RULES_MAX)?;
    let rules = rules
        .into_iter()
        .enumerate()
        .map(|(i, r)| rule(&format!("rules[{i}]"), r))
        .collect::<Result<Vec<_>, _>>()?;
    let limits = at_most("limits", raw.limits.unwrap_or_default(), AUTH_LIMITS_MAX)?;
    let mut checked: Vec<Limit> = Vec::with_capacity(limits.len());
    for (i, raw_limit) in limits.into_iter().enumerate() {
        let path = format!("limits[{i}]");
        let one = limit(&path, raw_limit)?;
        if checked.iter().any(|l| l.name == one.name) {
            return Err(fault(
                format!("{path}.name"),
                format!(
                    "found {} twice, expected unique limit names",
                    quote(&one.name)
                ),
            ));
        }
        checked.push(one);
    }
    Ok(ServerAuth {
        resource,
        authorization_servers,
        scopes,
        jwt: Jwt {
            issuer,
            audiences,
            jwks,
            jwks_ca,
            refresh,
            leeway,
            algorithms,
            groups_claim,
        },
        rules,
        limits: checked,
    })
}

/// `list` when it has at most `max` entries (`key` names them: `rules`, `limits`).
fn at_most<T>(key: &str, list: Vec<T>, max: usize) -> Result<Vec<T>, Fault> {
    if list.len() > max {
        return Err(fault(
            key,
            format!("found {} {key}, expected at most {max}", list.len()),
        ));
    }
    Ok(list)
}

fn jwks_source(cx: &AuthContext<'_>, value: Option<&Value>) -> Result<JwksSource, Fault> {
    const EXPECTED: &str = "a JWK Set file or an https:// URL";
    let value = value.ok_or_else(|| fault("jwt.jwks", format!("missing, expected {EXPECTED}")))?;
    let text = value.as_str().filter(|s| !s.is_empty()).ok_or_else(|| {
        fault(
            "jwt.jwks",
            format!("found {}, expected {EXPECTED}", render(value)),
        )
    })?;
    if text.starts_with("http://") || text.starts_with("https://") {
        let url = parse_upstream_url(text).map_err(|e| fault("jwt.jwks", e))?;
        if url.scheme != Scheme::Https {
            return Err(fault(
                "jwt.jwks",
                format!(
                    "found {}, expected an https:// URL (keys fetched in clear could be swapped on the way)",
                    quote(text)
                ),
            ));
        }
        return Ok(JwksSource::Url(url));
    }
    let path = cx.dir.join(text);
    let bytes = crate::jwks::read_file(&path)
        .map_err(|e| fault("jwt.jwks", format!("{}: {e}", path.display())))?;
    crate::jwks::parse(&bytes)
        .and_then(crate::jwks::require_keys)
        .map_err(|e| fault("jwt.jwks", format!("{}: {e}", path.display())))?;
    Ok(JwksSource::File(path))
}

fn rule(path: &str, raw: RawRule) -> Result<Rule, Fault> {
    // Whether the toolkit is one of the exit proxy's is checked once every binding is
    // (`validate::check_rule_toolkits`).
    let toolkit = match raw.toolkit.as_ref() {
        None => None,
        Some(value) => Some(claim_name(&format!("{path}.toolkit"), value)?),
    };
    let list = |key: &str, list: Option<Vec<Value>>, what: &str, check: Check| match list {
        Some(list) => strings(&format!("{path}.{key}"), &list, what, check),
        None => Ok(Vec::new()),
    };
    Ok(Rule {
        toolkit,
        tools: raw.tools,
        prompts: raw.prompts,
        resources: raw.resources,
        scopes: list("scopes", raw.scopes, "a scope", scope_string)?,
        groups: list("groups", raw.groups, "a group", header_string)?,
        subjects: list("subjects", raw.subjects, "a subject", header_string)?,
    })
}

fn limit(path: &str, raw: RawLimit) -> Result<Limit, Fault> {
    let name = raw
        .name
        .as_ref()
        .ok_or_else(|| {
            fault(
                format!("{path}.name"),
                "missing, expected a name such as per-caller",
            )
        })
        .and_then(|v| {
            let text = v.as_str().unwrap_or_default();
            let ok = (1..=LIMIT_NAME_BYTES_MAX).contains(&text.len())
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if ok {
                Ok(text.to_owned())
            } else {
                Err(fault(
                    format!("{path}.name"),
                    format!(
                        "found {}, expected 1 to 32 letters, digits, - or _",
                        render(v)
                    ),
                ))
            }
        })?;
    let per = raw
        .per
        .as_ref()
        .map(|v| claim_name(&format!("{path}.per"), v))
        .transpose()?
        .unwrap_or_else(|| LIMIT_PER_DEFAULT.to_owned());
    let rate_path = format!("{path}.rate");
    let rate = raw.rate.as_ref().ok_or_else(|| {
        fault(
            &rate_path,
            "missing, expected a rate such as 10/s, 600/m or 1000/h",
        )
    })?;
    let (count, period) = parse_rate(rate).map_err(|e| fault(&rate_path, e))?;
    let burst = match raw.burst.as_ref() {
        None => count,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=RATE_COUNT_MAX).contains(n))
            .ok_or_else(|| {
                fault(
                    format!("{path}.burst"),
                    format!(
                        "found {}, expected a whole number from 1 to 1000000",
                        render(v)
                    ),
                )
            })?,
    };
    Ok(Limit {
        name,
        per,
        tools: raw.tools,
        count,
        period,
        burst,
    })
}

/// `N/s`, `N/m` or `N/h`, `N` from 1 to 1,000,000.
fn parse_rate(value: &Value) -> Result<(u32, Duration), String> {
    let text = value.as_str().unwrap_or_default();
    let parsed = text.split_once('/').and_then(|(n, unit)| {
        let n: u32 = n
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=RATE_COUNT_MAX).contains(n))?;
        let period = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return None,
        };
        Some((n, period))
    });
    parsed.ok_or_else(|| {
        format!(
            "found {}, expected a rate such as 10/s, 600/m or 1000/h (1 to 1000000 per unit)",
            render(value)
        )
    })
}

/// A duration within `min..=max`, or the default.
fn duration(
    path: &str,
    value: Option<&Value>,
    default: Duration,
    min: Duration,
    max: Duration,
) -> Result<Duration, Fault> {
    let Some(value) = value else {
        return Ok(default);
    };
    let parsed = value
        .as_str()
        .ok_or_else(|| {
            format!(
                "found {}, expected {}",
                render(value),
                super::duration::DURATION_EXPECTED
            )
        })
        .and_then(super::duration::parse_duration)
        .map_err(|e| fault(path, e))?;
    if parsed < min || parsed > max {
        let expected = if min.is_zero() {
            format!("at most {}", format_duration(max))
        } else {
            format!("from {} to {}", format_duration(min), format_duration(max))
        };
        return Err(fault(
            path,
            format!("found {}, expected {expected}", format_duration(parsed)),
        ));
    }
    Ok(parsed)
}

type Check = fn(&str, &Value) -> Result<String, Fault>;

/// A list of at most [`AUTH_LIST_MAX`] strings, each checked by `check`.
fn strings(path: &str, list: &[Value], what: &str, check: Check) -> Result<Vec<String>, Fault> {
    if list.len() > AUTH_LIST_MAX {
        return Err(fault(
            path,
            format!(
                "found {} entries, expected at most {AUTH_LIST_MAX} of {what}",
                list.len()
            ),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| check(&format!("{path}[{i}]"), v))
        .collect()
}

/// A string safe inside a quoted header parameter and a JSON string: 1 to
/// [`AUTH_STRING_BYTES_MAX`] visible ASCII characters or spaces, without `"` or `\`.
fn header_string(path: &str, value: &Value) -> Result<String, Fault> {
    let text = value.as_str().unwrap_or_default();
    let ok = !text.is_empty()
        && text.len() <= AUTH_STRING_BYTES_MAX
        && text
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\');
    if ok {
        Ok(text.to_owned())
    } else {
        Err(fault(
            path,
            format!(
                "found {}, expected 1 to {AUTH_STRING_BYTES_MAX} printable ASCII characters without \" or \\",
                render(value)
            ),
        ))
    }
}

/// A scope token (RFC 6749 §3.3): visible ASCII without space, `"` or `\`.
fn scope_string(path: &str, value: &Value) -> Result<String, Fault> {
    let text = header_string(path, value)?;
    if text.contains(' ') {
        return Err(fault(
            path,
            format!("found {}, expected a scope without spaces", quote(&text)),
        ));
    }
    Ok(text)
}

/// An absolute `http://` or `https://` URL without spaces, quotes or a fragment.
fn url_string(path: &str, value: &Value) -> Result<String, Fault> {
    let text = header_string(path, value)?;
    let absolute = text.starts_with("https://") || text.starts_with("http://");
    if !absolute || text.contains([' ', '#']) {
        return Err(fault(
            path,
            format!(
                "found {}, expected an absolute http:// or https:// URL without spaces or #",
                quote(&text)
            ),
        ));
    }
    Ok(text)
}

/// A top-level claim name: 1 to [`CLAIM_NAME_BYTES_MAX`] letters, digits, `_`, `-` or
/// `:`. No `.`: a claim is looked up by its own name, so `realm.roles` would read as a
/// path into a nested claim that is never looked into.
fn claim_name(path: &str, value: &Value) -> Result<String, Fault> {
    let text = value.as_str().unwrap_or_default();
    let ok = (1..=CLAIM_NAME_BYTES_MAX).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':'));
    if ok {
        Ok(text.to_owned())
    } else {
        Err(fault(
            path,
            format!(
                "found {}, expected a top-level claim name (letters, digits, _, - or :)",
                render(value)
            ),
        ))
    }
}
