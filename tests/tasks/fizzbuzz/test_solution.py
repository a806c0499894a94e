import unittest
from solution import fizzbuzz

class T(unittest.TestCase):
    def test_small(self):
        self.assertEqual(fizzbuzz(5), ["1", "2", "Fizz", "4", "Buzz"])

    def test_fifteen(self):
        self.assertEqual(fizzbuzz(15)[-1], "FizzBuzz")
        self.assertEqual(fizzbuzz(15).count("Fizz"), 4)
