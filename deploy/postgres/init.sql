-- The two-service example's second database (the first, orders, is POSTGRES_DB).
CREATE DATABASE inventory OWNER bridge;
