-- A small school database written for decodebench's spider_mini task.
CREATE TABLE students (
    student_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    age INTEGER,
    city TEXT
);
CREATE TABLE courses (
    course_id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    credits INTEGER,
    teacher TEXT
);
CREATE TABLE enrollments (
    student_id INTEGER REFERENCES students(student_id),
    course_id INTEGER REFERENCES courses(course_id),
    grade INTEGER
);
INSERT INTO students VALUES
    (1, 'Alice', 20, 'Boston'), (2, 'Bruno', 22, 'Lisbon'), (3, 'Chen', 19, 'Boston'),
    (4, 'Dana', 21, 'Denver'), (5, 'Emil', 23, 'Lisbon'), (6, 'Farah', 20, 'Cairo'),
    (7, 'Gus', 24, 'Denver'), (8, 'Hana', 19, 'Tokyo');
INSERT INTO courses VALUES
    (10, 'Algebra', 4, 'Moore'), (11, 'Biology', 3, 'Nash'), (12, 'Chemistry', 4, 'Nash'),
    (13, 'Drawing', 2, 'Ortiz'), (14, 'Economics', 3, 'Moore');
INSERT INTO enrollments VALUES
    (1, 10, 88), (1, 11, 92), (2, 10, 75), (2, 12, 81), (3, 11, 95), (3, 13, 70),
    (4, 14, 64), (5, 10, 90), (5, 12, 85), (5, 14, 77), (6, 13, 99), (7, 11, 58),
    (8, 10, 91), (8, 14, 83);
