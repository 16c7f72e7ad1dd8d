-- The market's schema as the release before migrations (3948a04) created it on postgresql:
-- its tables and indexes, dumped from that checkout (sqlite_master, or the DDL it issued).
CREATE TABLE chain_deals (
	chain_deal_id BIGSERIAL NOT NULL, 
	client VARCHAR(42) NOT NULL, 
	provider VARCHAR(42) NOT NULL, 
	arbiter VARCHAR(42) NOT NULL, 
	quote_hash VARCHAR(66) NOT NULL, 
	plan_hash VARCHAR(66) NOT NULL, 
	max_spend VARCHAR(80) NOT NULL, 
	stake VARCHAR(80) NOT NULL, 
	penalty VARCHAR(80) NOT NULL, 
	expiry BIGINT NOT NULL, 
	challenge_window BIGINT NOT NULL, 
	slo_ms BIGINT NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	opened_tx VARCHAR(66) NOT NULL, 
	opened_block BIGINT NOT NULL, 
	last_tx VARCHAR(66) NOT NULL, 
	closed_tx VARCHAR(66), 
	reservation_fee VARCHAR(80) NOT NULL, 
	tasks_paid BIGINT NOT NULL, 
	tasks_claimed BIGINT NOT NULL, 
	paid VARCHAR(80) NOT NULL, 
	refunds BIGINT NOT NULL, 
	refunded VARCHAR(80) NOT NULL, 
	penalties VARCHAR(80) NOT NULL, 
	disputes_won BIGINT NOT NULL, 
	disputes_lost BIGINT NOT NULL, 
	returned_to_client VARCHAR(80), 
	batches_json TEXT NOT NULL, 
	PRIMARY KEY (chain_deal_id)
);

CREATE TABLE chain_events (
	tx_hash VARCHAR(66) NOT NULL, 
	log_index BIGINT NOT NULL, 
	block_number BIGINT NOT NULL, 
	name VARCHAR(32) NOT NULL, 
	chain_deal_id BIGINT, 
	args_json TEXT NOT NULL, 
	PRIMARY KEY (tx_hash, log_index)
);

CREATE TABLE deals (
	deal_id VARCHAR(90) NOT NULL, 
	device_class VARCHAR(64) NOT NULL, 
	bid_id VARCHAR(66) NOT NULL, 
	ask_id VARCHAR(66) NOT NULL, 
	client VARCHAR(42) NOT NULL, 
	provider VARCHAR(42) NOT NULL, 
	price BIGINT NOT NULL, 
	quantity BIGINT NOT NULL, 
	max_spend VARCHAR(80) NOT NULL, 
	created_at FLOAT NOT NULL, 
	chain_deal_id BIGINT, 
	quote_hash VARCHAR(66) NOT NULL, 
	quote_json TEXT, 
	quote_signature VARCHAR(132), 
	PRIMARY KEY (deal_id)
);

CREATE TABLE fills (
	device_class VARCHAR(64) NOT NULL, 
	fill_id BIGINT NOT NULL, 
	bid_id VARCHAR(66) NOT NULL, 
	ask_id VARCHAR(66) NOT NULL, 
	price BIGINT NOT NULL, 
	quantity BIGINT NOT NULL, 
	aggressor VARCHAR(3) NOT NULL, 
	time BIGINT NOT NULL, 
	id VARCHAR(90) NOT NULL, 
	PRIMARY KEY (id)
);

CREATE TABLE indexer_state (
	name VARCHAR(64) NOT NULL, 
	block BIGINT NOT NULL, 
	PRIMARY KEY (name)
);

CREATE TABLE nonces (
	owner VARCHAR(42) NOT NULL, 
	nonce BIGINT NOT NULL, 
	PRIMARY KEY (owner, nonce)
);

CREATE TABLE orders (
	side VARCHAR(3) NOT NULL, 
	owner VARCHAR(42) NOT NULL, 
	device_class VARCHAR(64) NOT NULL, 
	quantity BIGINT NOT NULL, 
	price BIGINT NOT NULL, 
	plan VARCHAR(64) NOT NULL, 
	slo_ms BIGINT NOT NULL, 
	memory BIGINT NOT NULL, 
	expiry BIGINT NOT NULL, 
	nonce BIGINT NOT NULL, 
	order_id VARCHAR(66) NOT NULL, 
	seq BIGINT NOT NULL, 
	state VARCHAR(20) NOT NULL, 
	remaining BIGINT NOT NULL, 
	created_at FLOAT NOT NULL, 
	signature VARCHAR(132) NOT NULL, 
	quote_json TEXT, 
	quote_signature VARCHAR(132), 
	quote_hash VARCHAR(66), 
	PRIMARY KEY (order_id), 
	CONSTRAINT uq_orders_class_seq UNIQUE (device_class, seq)
);

CREATE TABLE provider_clients (
	provider VARCHAR(42) NOT NULL, 
	client VARCHAR(42) NOT NULL, 
	deals BIGINT NOT NULL, 
	paid VARCHAR(80) NOT NULL, 
	refunded VARCHAR(80) NOT NULL, 
	penalties VARCHAR(80) NOT NULL, 
	refunds BIGINT NOT NULL, 
	disputes_won BIGINT NOT NULL, 
	disputes_lost BIGINT NOT NULL, 
	PRIMARY KEY (provider, client)
);

CREATE TABLE providers (
	address VARCHAR(42) NOT NULL, 
	device_class VARCHAR(64) NOT NULL, 
	device_kind VARCHAR(64) NOT NULL, 
	device_count BIGINT NOT NULL, 
	price BIGINT NOT NULL, 
	throughput FLOAT NOT NULL, 
	capacity BIGINT NOT NULL, 
	endpoint VARCHAR(256) NOT NULL, 
	last_seen FLOAT NOT NULL, 
	online BOOLEAN NOT NULL, 
	heartbeat_ts BIGINT NOT NULL, 
	advert_json TEXT NOT NULL, 
	PRIMARY KEY (address)
);

CREATE INDEX ix_chain_deals_provider ON chain_deals (provider);

CREATE INDEX ix_chain_deals_quote_hash ON chain_deals (quote_hash);

CREATE INDEX ix_chain_events_block_number ON chain_events (block_number);

CREATE INDEX ix_chain_events_chain_deal_id ON chain_events (chain_deal_id);

CREATE INDEX ix_deals_client ON deals (client);

CREATE INDEX ix_deals_provider ON deals (provider);

CREATE INDEX ix_deals_quote_hash ON deals (quote_hash);

CREATE INDEX ix_fills_device_class ON fills (device_class);

CREATE INDEX ix_fills_time ON fills (time);

CREATE INDEX ix_orders_class_state ON orders (device_class, state);

CREATE UNIQUE INDEX uq_orders_owner_nonce ON orders (owner, nonce);

CREATE INDEX ix_orders_owner_live ON orders (owner) WHERE state IN ('open', 'partially_filled');
