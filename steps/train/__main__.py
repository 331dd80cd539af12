from steps.train.step import main

raise SystemExit(main())
