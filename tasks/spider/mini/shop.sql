-- A small shop database written for decodebench's spider_mini task.
CREATE TABLE customers (
    customer_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    country TEXT
);
CREATE TABLE products (
    product_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT,
    price REAL
);
CREATE TABLE orders (
    order_id INTEGER PRIMARY KEY,
    customer_id INTEGER REFERENCES customers(customer_id),
    product_id INTEGER REFERENCES products(product_id),
    quantity INTEGER,
    order_date TEXT
);
INSERT INTO customers VALUES
    (1, 'Acme Corp', 'USA'), (2, 'Blue Ltd', 'UK'), (3, 'Casa Verde', 'Spain'),
    (4, 'Delta GmbH', 'Germany'), (5, 'Echo Inc', 'USA'), (6, 'Fjord AS', 'Norway');
INSERT INTO products VALUES
    (100, 'Desk', 'furniture', 250.0), (101, 'Chair', 'furniture', 90.0), (102, 'Lamp', 'lighting', 35.5),
    (103, 'Monitor', 'electronics', 199.99), (104, 'Keyboard', 'electronics', 49.0), (105, 'Bulb', 'lighting', 4.5);
INSERT INTO orders VALUES
    (1, 1, 100, 2, '2024-01-05'), (2, 1, 103, 5, '2024-01-07'), (3, 2, 101, 4, '2024-02-11'),
    (4, 3, 102, 10, '2024-02-15'), (5, 3, 105, 50, '2024-03-01'), (6, 4, 104, 3, '2024-03-09'),
    (7, 5, 103, 1, '2024-03-20'), (8, 5, 101, 6, '2024-04-02'), (9, 2, 105, 20, '2024-04-18'),
    (10, 1, 104, 2, '2024-05-01');
