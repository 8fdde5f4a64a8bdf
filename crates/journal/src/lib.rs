//! sortie-journal: placeholder until the journal lands.
