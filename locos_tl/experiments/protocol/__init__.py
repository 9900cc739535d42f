"""The paper's protocol on a real model: stages, tables, report (`locos reproduce`)."""
