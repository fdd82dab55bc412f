//! Credit arithmetic for one direction of an internal stream.

/// Credit for one direction, shared by its sender and its receiver.
///
/// Invariant: `ack <= seq <= ack + max + lent` and `lent <= seq - ack`: the sender never
/// has more than `max` bytes the receiver has not acknowledged, besides the bytes it sent
/// whole outside the window ([`Window::lend`]), which the receiver's first acks pay back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Bytes sent so far.
    seq: u64,
    /// Bytes acknowledged so far by the receiver.
    ack: u64,
    /// Most bytes allowed in flight.
    max: u32,
    /// Bytes sent outside the window and not yet paid back by acks.
    lent: u64,
}

impl Window {
    /// A window allowing `max` unacknowledged bytes, nothing sent yet.
    pub fn new(max: u32) -> Self {
        assert!(max > 0);
        Self {
            seq: 0,
            ack: 0,
            max,
            lent: 0,
        }
    }

    /// Bytes the sender may send now (never more than `max`: lent bytes do not add to it).
    pub fn credit(&self) -> u32 {
        let in_flight = self.seq - self.ack;
        assert!(self.lent <= in_flight);
        let counted = in_flight - self.lent;
        assert!(counted <= u64::from(self.max));
        self.max - counted as u32
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

    /// Records `bytes` sent whole outside the window, whatever its credit: bytes the
    /// sender holds in full anyway, so queuing them adds no memory. The receiver's acks
    /// pay them back first, so the credit for other bytes never exceeds `max`.
    pub fn lend(&mut self, bytes: u64) {
        self.seq += bytes;
        self.lent += bytes;
    }

    /// Bytes sent whole and not yet paid back.
    pub fn lent(&self) -> u64 {
        self.lent
    }

    /// Records the receiver acknowledging `bytes` more bytes; returns the new ack.
    pub fn on_ack(&mut self, bytes: u32) -> u64 {
        let ack = self.ack + u64::from(bytes);
        assert!(ack <= self.seq);
        self.ack = ack;
        self.lent -= self.lent.min(u64::from(bytes));
        ack
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
        assert_eq!(w.on_ack(70), 100);
        assert_eq!((w.credit(), w.in_flight()), (100, 0));
    }

    #[test]
    fn lent_bytes_pass_a_closed_window_and_are_paid_back_first() {
        let mut w = Window::new(100);
        w.on_sent(100);
        w.lend(1_000);
        assert_eq!((w.credit(), w.in_flight()), (0, 1_100));
        // Acks pay the loan back before they open the window again.
        w.on_ack(900);
        assert_eq!(w.credit(), 0);
        w.on_ack(150);
        assert_eq!((w.credit(), w.in_flight()), (50, 50));
        w.on_ack(50);
        assert_eq!(w.credit(), 100);
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
            let roll = next() % 5;
            if roll < 2 {
                let n = (next() % (u64::from(w.credit()) + 1)) as u32;
                w.on_sent(n);
                sent += u64::from(n);
            } else if roll == 2 {
                let n = next() % (64 * 1024);
                w.lend(n);
                sent += n;
            } else {
                let n = (next() % (w.in_flight() + 1)) as u32;
                w.on_ack(n);
                acked += u64::from(n);
            }
            assert!(acked <= sent, "seed {seed}");
            assert_eq!(w.in_flight(), sent - acked, "seed {seed}");
            assert!(w.credit() <= 32 * 1024, "seed {seed}");
        }
    }
}
