# Queue declarations used by the test suite live here.
