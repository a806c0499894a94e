import unittest
from solution import search

class T(unittest.TestCase):
    def test_found(self):
        xs = list(range(0, 1000, 3))
        for i, x in enumerate(xs):
            self.assertEqual(search(xs, x), i)

    def test_missing(self):
        self.assertEqual(search([1, 3, 5], 4), -1)
        self.assertEqual(search([], 1), -1)

    def test_last(self):
        self.assertEqual(search([1, 2], 2), 1)
