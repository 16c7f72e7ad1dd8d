"""Market: matching engine, order book storage and API, chain indexer, web order book."""
