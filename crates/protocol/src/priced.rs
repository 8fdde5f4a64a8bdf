//! A reader whose usage is priced by sortie (#37): an agent that reports tokens but no cost
//! (Codex) has every usage it reports charged at its model's price ([`ModelPrice::cost`]), so
//! that the watchdog's task budget, the journaled usage and the run's budget all see a cost.
//! The price comes from the run's stored config; the cost is journaled with the usage, never
//! computed again on reading.

use sortie_core::Usage;
use sortie_core::prices::ModelPrice;

use crate::{Exit, Finished, Progress, ProtocolReader, RunPhase};

/// `inner`, with every usage it reports charged at `price`.
pub fn priced(inner: Box<dyn ProtocolReader>, price: ModelPrice) -> Box<dyn ProtocolReader> {
    Box::new(Priced { inner, price })
}

struct Priced {
    inner: Box<dyn ProtocolReader>,
    price: ModelPrice,
}

impl Priced {
    fn charge(&self, mut usage: Usage) -> Usage {
        usage.cost = self.price.cost(&usage);
        usage
    }
}

impl ProtocolReader for Priced {
    fn seed(&mut self, usage: Usage) {
        self.inner.seed(usage);
    }

    fn line(&mut self, line: &str) -> Option<Progress> {
        let p = self.inner.line(line)?;
        Some(Progress {
            usage: self.charge(p.usage),
            ..p
        })
    }

    fn finish(self: Box<Self>, exit: Exit, stderr_tail: &str) -> Finished {
        let price = self.price;
        let mut finished = self.inner.finish(exit, stderr_tail);
        finished.usage.cost = price.cost(&finished.usage);
        finished
    }

    fn parse_errors(&self) -> u64 {
        self.inner.parse_errors()
    }

    fn run_phase(&self) -> RunPhase {
        self.inner.run_phase()
    }

    fn session(&self) -> Option<&str> {
        self.inner.session()
    }

    fn answer(&self) -> Option<String> {
        self.inner.answer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::Protocol;

    #[test]
    fn a_codex_stream_is_charged_at_its_models_price() {
        let price = ModelPrice::from_usd([1.25, 10.0, 0.125, 0.0]);
        let mut r = priced(crate::reader_for(Protocol::CodexJson), price);
        let usage = r#"{"type":"turn.completed","usage":{"input_tokens":150,"cached_input_tokens":50,"cache_write_input_tokens":0,"output_tokens":12,"reasoning_output_tokens":4}}"#;
        r.line(r#"{"type":"thread.started","thread_id":"t"}"#);
        r.line(r#"{"type":"turn.started"}"#);
        let p = r.line(usage).expect("the usage is progress");
        // 100 × 1.25 + 12 × 10 + 50 × 0.125 micro-dollars, complete.
        assert_eq!((p.usage.cost.nanos, p.usage.cost.unreported), (251_250, 0));
        let f = r.finish(Exit::Code(0), "");
        assert_eq!((f.usage.cost.nanos, f.usage.cost.unreported), (251_250, 0));
    }
}
