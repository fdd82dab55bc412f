//! Credit arithmetic for one direction of an internal stream.

/// Credit for one direction, shared by its sender and its receiver.
///
/// Invariant: `ack <= seq <= ack + max`: the sender never has more than `max` bytes that
/// the receiver has not acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Bytes sent so far.
    seq: u64,
    /// Bytes acknowledged so far by the receiver.
    ack: u64,
    /// Most bytes allowed in flight.
    max: u32,
}

impl Window {
    /// A window allowing `max` unacknowledged bytes, nothing sent yet.
    pub fn new(max: u32) -> Self {
        assert!(max > 0);
        Self {
            seq: 0,
            ack: 0,
            max,
        }
    }

    /// Bytes the sender may send now.
    pub fn credit(&self) -> u32 {
        let in_flight = self.seq - self.ack;
        assert!(in_flight <= u64::from(self.max));
        self.max - in_flight as u32
    }

    /// Bytes sent and not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.seq - self.ack
    }

    /// Records `reserved` bytes sent; they must fit the current credit.
    pub fn on_sent(&mut self, reserved: u32) {
        assert!(reserved <= self.credit());
        self.seq += u64::from(reserved);
    }

    /// Records the receiver acknowledging `bytes` more bytes; returns the new ack.
    pub fn on_ack(&mut self, bytes: u32) -> u64 {
        let ack = self.ack + u64::from(bytes);
        assert!(ack <= self.seq);
        self.ack = ack;
        ack
    }

    /// Applies a WINDOW frame: acknowledgement up to `ack` and a new `max`.
    pub fn on_window(&mut self, ack: u64, max: u32) {
        assert!(ack >= self.ack);
        assert!(ack <= self.seq);
        assert!(self.seq - ack <= u64::from(max));
        (self.ack, self.max) = (ack, max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_follows_sends_and_acks() {
        let mut w = Window::new(100);
        assert_eq!(w.credit(), 100);
        w.on_sent(60);
        assert_eq!((w.credit(), w.in_flight()), (40, 60));
        w.on_sent(40);
        assert_eq!(w.credit(), 0);
        assert_eq!(w.on_ack(30), 30);
        assert_eq!(w.credit(), 30);
        w.on_window(100, 200);
        assert_eq!((w.credit(), w.in_flight()), (200, 0));
    }

    #[test]
    #[should_panic]
    fn sending_past_credit_is_a_bug() {
        let mut w = Window::new(10);
        w.on_sent(11);
    }

    #[test]
    #[should_panic]
    fn acking_unsent_bytes_is_a_bug() {
        let mut w = Window::new(10);
        w.on_sent(5);
        w.on_ack(6);
    }

    /// Seeded random sequences of sends and acks keep `ack <= seq <= ack + max`.
    #[test]
    fn random_sequences_keep_the_invariant() {
        let seed: u64 = std::env::var("MCPYARD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_1234);
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut w = Window::new(32 * 1024);
        let (mut sent, mut acked) = (0u64, 0u64);
        for _ in 0..100_000 {
            if next() % 2 == 0 {
                let n = (next() % (u64::from(w.credit()) + 1)) as u32;
                w.on_sent(n);
                sent += u64::from(n);
            } else {
                let n = (next() % (w.in_flight() + 1)) as u32;
                w.on_ack(n);
                acked += u64::from(n);
            }
            assert!(acked <= sent, "seed {seed}");
            assert_eq!(w.in_flight(), sent - acked, "seed {seed}");
        }
    }
}
