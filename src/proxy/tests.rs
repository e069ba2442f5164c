//! Root tests: see below.
