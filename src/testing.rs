//! Test-only helpers shared by the tests of several modules: a seeded generator for the
//! randomized ones, a worker-like event loop for the binding tests, and a certificate
//! authority made at test time for the TLS tests (the adapter's and the upstream pool's).

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::path::PathBuf;

/// xorshift64*: tiny, deterministic, good enough to pick test inputs.
pub struct Rng(pub u64);

impl Rng {
    /// A generator seeded from `MCPYARD_SEED` when set, else from `default_seed`; print
    /// the seed in assertion messages so a failure can be replayed.
    pub fn seeded(default_seed: u64) -> (Rng, u64) {
        let seed = std::env::var("MCPYARD_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(default_seed)
            // xorshift must not start at zero.
            .max(1);
        (Rng(seed), seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// An index in `0..n` (`n > 0`).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        let at = self.index(items.len());
        *items.get(at).unwrap_or_else(|| panic!("empty pick"))
    }
}

/// One of `seeds` with up to four random byte edits (replace, insert or remove) drawn from
/// `alphabet`: the inputs of the tests that hold a hand-written parser to a reference.
pub fn mutated(rng: &mut Rng, seeds: &[&str], alphabet: &[u8]) -> Vec<u8> {
    let mut bytes = rng.pick(seeds).as_bytes().to_vec();
    for _ in 0..=rng.below(3) {
        if bytes.is_empty() {
            break;
        }
        let at = rng.index(bytes.len());
        let with = rng.pick(alphabet);
        match rng.below(3) {
            0 => {
                if let Some(b) = bytes.get_mut(at) {
                    *b = with;
                }
            }
            1 => bytes.insert(at, with),
            _ => {
                bytes.remove(at);
            }
        }
    }
    bytes
}

/// Runs `f` to completion on a current-thread tokio runtime inside a `LocalSet`, as a
/// worker runs its tasks (so `spawn_local` works).
pub fn run_local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("test runtime: {e}"));
    tokio::task::LocalSet::new().block_on(&rt, async move {
        crate::runtime::deadline::start();
        f.await
    })
}

/// Lets the other tasks of a [`run_local`] test run for `turns` turns of its loop.
pub async fn settle(turns: usize) {
    for _ in 0..turns {
        tokio::task::yield_now().await;
    }
}

/// A CA, written to a directory of its own, that signs leaf certificates.
pub struct Ca {
    /// Its files and its leaves' (removed on drop).
    pub dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM), to trust.
    pub pem: PathBuf,
}

impl Ca {
    pub fn new(tag: &str) -> Ca {
        let dir = std::env::temp_dir().join(format!("mcpyard-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("mcpyard test CA {tag}"));
        let cert = params.self_signed(&key).expect("self-signed");
        let pem = dir.join("ca.pem");
        std::fs::write(&pem, cert.pem()).expect("write ca");
        Ca {
            dir,
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A leaf for `names`, valid now unless `expired`; returns (cert, key) files.
    pub fn leaf(&self, file: &str, names: &[&str], expired: bool) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let cert_path = self.dir.join(format!("{file}.pem"));
        let key_path = self.dir.join(format!("{file}.key"));
        std::fs::write(&cert_path, cert.pem()).expect("write cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        (cert_path, key_path)
    }
}

impl Drop for Ca {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
