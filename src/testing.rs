//! Test-only helpers shared by the tests of several modules: a seeded generator for the
//! randomized ones, and a worker-like event loop for the binding tests.

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

/// Runs `f` to completion on a current-thread tokio runtime inside a `LocalSet`, as a
/// worker runs its tasks (so `spawn_local` works).
pub fn run_local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("test runtime: {e}"));
    tokio::task::LocalSet::new().block_on(&rt, f)
}
