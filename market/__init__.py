"""Market: matching engine, order book storage and API, chain indexer, web order book."""

from market.native import check_extensions

check_extensions()
